"""mcp-celery: Celery jobs as MCP tools that run as SEP-2663 tasks.

    app = Celery("jobs", broker=..., backend="redis://...")
    mcp_celery.configure_app(app)

    @mcp_celery.tool(app)
    def slow_compute(ctx: mcp_celery.JobContext, seconds: float) -> str: ...

Workers run `celery -A jobs worker` as usual; `mcp-celery serve -A jobs` serves MCP.

The package is layered; each tier imports only the ones above it in this list:

    protocol, errors, settings, inputs,   tier 0: the wire vocabulary and models, the one error tree, pure
    logs, redact, tracing, idempotency    (idempotency: where a tools/call carries its key)
    store/, core/                         tier 1: the Redis store; the shared Celery model (binding,
                                          tools, task options, status, workflows)
    worker/                               job code and Celery workers (celery, redis; never `mcp`)
    server/                               the MCP server: engine/, tasks/, plain/, edge/, ops/
    client/                               the client library (`mcp` only; no celery, no redis)
    cli/                                  the `mcp-celery` command (top, demo)
    testing/                              process and JSON-RPC helpers for tests and the demo

`docs/development.md` draws the map.

Names here are loaded lazily (PEP 562), so `import mcp_celery.client` does not drag in
Celery, and `mcp_celery.create_server` loads the server only when first used.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from mcp_types import CreateMessageResult, CreateMessageResultWithTools, ElicitResult, ListRootsResult

    from mcp_celery.core.approvals import Approval
    from mcp_celery.core.workflows import MemberStatus
    from mcp_celery.errors import (
        ArtifactError,
        ConfigurationError,
        InputNotSupported,
        InputTimeout,
        JobSignal,
        McpCeleryError,
        ProtocolError,
        TaskCancelled,
        ToolDefinitionError,
    )
    from mcp_celery.inputs import elicitation, roots_request, sampling
    from mcp_celery.server import create_server
    from mcp_celery.settings import Settings
    from mcp_celery.worker import JobContext, configure_app, current_context, expose, tool

#: Public name → the module that defines it.
_EXPORTS = {
    "CreateMessageResult": "mcp_types",
    "CreateMessageResultWithTools": "mcp_types",
    "ElicitResult": "mcp_types",
    "ListRootsResult": "mcp_types",
    "ArtifactError": "mcp_celery.errors",
    "ConfigurationError": "mcp_celery.errors",
    "InputNotSupported": "mcp_celery.errors",
    "InputTimeout": "mcp_celery.errors",
    "JobSignal": "mcp_celery.errors",
    "McpCeleryError": "mcp_celery.errors",
    "ProtocolError": "mcp_celery.errors",
    "TaskCancelled": "mcp_celery.errors",
    "ToolDefinitionError": "mcp_celery.errors",
    "elicitation": "mcp_celery.inputs",
    "roots_request": "mcp_celery.inputs",
    "sampling": "mcp_celery.inputs",
    "Settings": "mcp_celery.settings",
    "create_server": "mcp_celery.server",
    "JobContext": "mcp_celery.worker",
    "configure_app": "mcp_celery.worker",
    "current_context": "mcp_celery.worker",
    "expose": "mcp_celery.worker",
    "tool": "mcp_celery.worker",
    "MemberStatus": "mcp_celery.core.workflows",
    "Approval": "mcp_celery.core.approvals",
}

__all__ = [
    "Approval",
    "ArtifactError",
    "ConfigurationError",
    "CreateMessageResult",
    "CreateMessageResultWithTools",
    "ElicitResult",
    "InputNotSupported",
    "InputTimeout",
    "JobContext",
    "JobSignal",
    "ListRootsResult",
    "McpCeleryError",
    "MemberStatus",
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


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mcp_celery' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return __all__
