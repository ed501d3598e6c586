"""mcp-celery: Celery jobs as MCP tools that run as SEP-2663 tasks.

    app = Celery("jobs", broker=..., backend="redis://...")
    mcp_celery.configure_app(app)

    @mcp_celery.tool(app)
    def slow_compute(ctx: mcp_celery.JobContext, seconds: float) -> str: ...

Workers run `celery -A jobs worker` as usual; `mcp-celery serve -A jobs` serves MCP.
The worker side never imports the MCP server; `create_server` loads it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult

from mcp_celery._version import __version__
from mcp_celery.context import JobContext, current_context
from mcp_celery.errors import (
    ConfigurationError,
    InputNotSupported,
    InputTimeout,
    McpCeleryError,
    ProtocolError,
    TaskCancelled,
    ToolDefinitionError,
)
from mcp_celery.inputs import elicitation, roots_request, sampling
from mcp_celery.settings import Settings
from mcp_celery.worker import configure_app, expose, tool

if TYPE_CHECKING:
    from mcp_celery.server import create_server

__all__ = [
    "ConfigurationError",
    "CreateMessageResult",
    "ElicitResult",
    "InputNotSupported",
    "InputTimeout",
    "JobContext",
    "ListRootsResult",
    "McpCeleryError",
    "ProtocolError",
    "Settings",
    "TaskCancelled",
    "ToolDefinitionError",
    "__version__",
    "configure_app",
    "create_server",
    "current_context",
    "elicitation",
    "expose",
    "roots_request",
    "sampling",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "create_server":
        from mcp_celery.server import create_server

        return create_server
    raise AttributeError(f"module 'mcp_celery' has no attribute {name!r}")
