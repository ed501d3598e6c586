"""The worker tier: what job code and Celery workers use.

Imports celery and redis, never `mcp` (the SDK package loads its server and client on import);
`tests/test_layering.py` holds it to that.
"""

from mcp_celery.worker import signals
from mcp_celery.worker.config import configure_app
from mcp_celery.worker.context import JobContext, current_context
from mcp_celery.worker.decorators import expose, tool

__all__ = ["JobContext", "configure_app", "current_context", "expose", "tool"]

signals.connect()  # the one place the worker tier hooks into Celery's signals
