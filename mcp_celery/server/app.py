"""`create_server`: the SDK's lowlevel `Server` wired to a Celery app's tools.

Server tier: the wiring and the lifespan only. Creating tasks lives in `creation`, the
`tasks/*` handlers in `handlers`, what a request's envelope says in `envelope`, and the state
they share in `service`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from celery import Celery
from celery import _state as celery_state
from mcp import types
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel import Server

from mcp_celery import __version__, idempotency, tracing
from mcp_celery.core.binding import AppBinding
from mcp_celery.core.task_options import settle
from mcp_celery.core.tools import registry
from mcp_celery.errors import ToolDefinitionError
from mcp_celery.protocol import TASKS_EXTENSION, TaskIdParams, UpdateTaskParams
from mcp_celery.server import resources
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.service import TaskService
from mcp_celery.server.ops import metrics
from mcp_celery.server.plain import call as plain
from mcp_celery.server.plain import lifecycle
from mcp_celery.server.tasks import creation, envelope, handlers, listen
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.settings import Settings

__all__ = ["check_tool_names", "create_server", "serving"]


def create_server(app: Celery, settings: Settings | None = None, *, name: str | None = None) -> Server[Any]:
    """An MCP server for every tool registered on `app`: `serving(...)`'s server (its docstring says more)."""
    return serving(app, settings, name=name)[0]


def serving(
    app: Celery, settings: Settings | None = None, *, name: str | None = None
) -> tuple[Server[Any], TaskService]:
    """An MCP server for every tool registered on `app` (build it after importing the job module).

    The tools' Celery options are settled from the app's configuration as it is now
    (`mcp_celery.core.task_options`): the messages this server publishes carry their time limits.

    Args:
        app: the Celery app whose tools to serve.
        settings: mcp-celery's settings (default: read from the MCP_CELERY_* environment).
        name: the name the server gives itself to clients (default `mcp-celery (APP)`).

    Returns the server and the task service it serves, for the HTTP app's other surfaces (the
    artifact download, the approval page).

    Raises:
        ConfigurationError: the app cannot back MCP tasks (e.g. its result backend is not Redis).
        ToolDefinitionError: an at-least-once tool's hard time limit is not below the visibility
            timeout, or a tool takes the name of a lifecycle tool (task_status, task_respond,
            task_cancel) while the fallback for clients without the tasks extension is on.
    """
    settle(app)
    settings = settings or Settings()
    check_tool_names(app, settings)
    # This process never waits on a Celery result with AsyncResult.get(). Telling Celery so
    # stops its Redis backend from SUBSCRIBE-ing to every task the server queues (and never
    # unsubscribing until the result arrives): two commands and a growing channel set per task.
    celery_state._set_task_join_will_block(True)  # type: ignore[attr-defined]
    service = TaskService(AppBinding.create(app, settings))

    lifespan = _shared_lifespan(service)
    list_tools = _tool_lister(service)

    def input_schema(tool: str) -> dict[str, Any] | None:
        spec = service.tools.get(tool)
        return None if spec is None else spec.input_schema

    server: Server[Any] = Server(
        name or f"mcp-celery ({app.main})",
        version=__version__,
        lifespan=lifespan,
        on_list_tools=list_tools,
        # Without this the SDK runs the whole tools/list handler on every tools/call that has
        # arguments, to find the schema it checks Mcp-Param headers against.
        get_tool_input_schema=input_schema,
    )
    # Outermost: the SDK's own span (next in the list) is then a child of the HTTP headers' trace context.
    server.middleware.insert(0, _trace_context_of_http_headers)
    _add_handlers(server, service)
    server.extensions[TASKS_EXTENSION] = {}
    # A client may send a tools/call again with the same key when its reply is lost (`engine.repeats`).
    server.extensions[idempotency.SERVER_EXTENSION] = {"header": idempotency.HEADER, "meta": idempotency.META}
    return server, service


async def _trace_context_of_http_headers(ctx: RequestContext, call_next: CallNext) -> HandlerResult:
    """The W3C trace context of a Streamable HTTP request's headers, for a request whose `_meta` has none."""
    with tracing.parent_from_headers(getattr(ctx.request, "headers", None)):
        return await call_next(ctx)


def _shared_lifespan(service: TaskService) -> Callable[[Server[Any]], AbstractAsyncContextManager[dict[str, Any]]]:
    """The server's lifespan, shared: the HTTP server's two apps (JSON and streaming answers) both enter
    it, nested in one task; the first starts the service, the last to leave stops it."""
    users = 0
    running = AsyncExitStack()

    @asynccontextmanager
    async def lifespan(_: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        nonlocal users
        if users == 0:
            await running.enter_async_context(service.running())
        users += 1
        try:
            yield {}
        finally:
            users -= 1
            if users == 0:
                await running.aclose()

    return lifespan


def _tool_lister(
    service: TaskService,
) -> Callable[[RequestContext, types.PaginatedRequestParams | None], Awaitable[types.ListToolsResult]]:
    """`tools/list`: the job tools, and for a request without the tasks extension the lifecycle tools too."""
    fallback = service.settings.tool_fallback
    lifecycle_tools = [types.Tool.model_validate(tool) for tool in lifecycle.TOOLS]

    async def list_tools(ctx: RequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        metrics.record_request("tools/list", "ok")
        if not fallback or envelope.tasks_declared(ctx):
            return types.ListToolsResult(tools=[types.Tool.model_validate(s.to_wire()) for s in service.tools.values()])
        # A client without the extension reaches running tasks through the lifecycle tools.
        jobs = [types.Tool.model_validate(plain.listed_tool(s)) for s in service.tools.values()]
        return types.ListToolsResult(tools=[*jobs, *lifecycle_tools])

    return list_tools


def check_tool_names(app: Celery, settings: Settings) -> None:
    """Refuse job tools named like the lifecycle tools while clients without the extension are served.

    Raises:
        ToolDefinitionError: a tool is named task_status, task_respond or task_cancel.
    """
    taken = sorted(lifecycle.NAMES & set(registry(app))) if settings.tool_fallback else []
    if taken:
        raise ToolDefinitionError(
            f"tool name(s) {', '.join(taken)} belong to the lifecycle tools that clients without the tasks "
            "extension use; pass name=... to rename yours, or set MCP_CELERY_TOOL_FALLBACK=false"
        )


def _add_handlers(server: Server[Any], service: TaskService) -> None:
    # safe_errors: an unexpected exception reaches the client as a bare -32603, never its text.
    guard = functools.partial(limits.safe_errors, service.settings)

    async def call_tool(ctx: RequestContext, params: types.CallToolRequestParams) -> Any:
        return await creation.call_tool(service, ctx, params)

    async def tasks_get(ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
        return await handlers.tasks_get(service, ctx, params)

    async def tasks_update(ctx: RequestContext, params: UpdateTaskParams) -> dict[str, Any]:
        return await handlers.tasks_update(service, ctx, params)

    async def tasks_cancel(ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
        return await handlers.tasks_cancel(service, ctx, params)

    async def subscriptions_listen(
        ctx: RequestContext, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        return await listen.listen(service, ctx, params)

    fallback = service.settings.tool_fallback

    def tool_label(name: str) -> str:
        # Only names this server serves become metric labels: made-up tool names cannot grow the series.
        return name if name in service.tools or (fallback and name in lifecycle.NAMES) else "unknown"

    server.add_request_handler(
        "tools/call", types.CallToolRequestParams, metrics.measured_tool_call(guard(call_tool), tool_label)
    )
    server.add_request_handler("tasks/get", TaskIdParams, metrics.measured("tasks/get", guard(tasks_get)))
    server.add_request_handler("tasks/update", UpdateTaskParams, metrics.measured("tasks/update", guard(tasks_update)))
    server.add_request_handler("tasks/cancel", TaskIdParams, metrics.measured("tasks/cancel", guard(tasks_cancel)))

    _add_resource_handlers(server, service)
    server.add_request_handler(
        "subscriptions/listen",
        types.SubscriptionsListenRequestParams,
        metrics.measured("subscriptions/listen", guard(subscriptions_listen)),
    )


def _add_resource_handlers(server: Server[Any], service: TaskService) -> None:
    """`resources/read` of the tasks' artifacts, and an empty `resources/list` (so the capability is declared)."""
    guard = functools.partial(limits.safe_errors, service.settings)

    async def read_resource(ctx: RequestContext, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await resources.read_resource(service, ctx, params)

    async def list_resources(
        ctx: RequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return await resources.list_resources(service, ctx, params)

    server.add_request_handler(
        "resources/read", types.ReadResourceRequestParams, metrics.measured("resources/read", guard(read_resource))
    )
    server.add_request_handler(
        "resources/list", types.PaginatedRequestParams, metrics.measured("resources/list", guard(list_resources))
    )
