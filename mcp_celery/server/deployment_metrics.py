"""`mcp_celery.server.deployment_metrics`, the path the operations guide once gave: now in `ops/`.

Importing this path gives that very module (the same object, so its collectors and state are shared).
"""

import sys

from mcp_celery.server.ops import deployment_metrics as _module

sys.modules[__name__] = _module
