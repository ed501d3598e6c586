"""`mcp_celery.server.metrics`, the path the operations guide once gave, for `mcp_celery.server.ops.metrics`.

Importing this path gives that very module (the same object, so its collectors and state are shared).
"""

import sys

from mcp_celery.server.ops import metrics as _module

sys.modules[__name__] = _module
