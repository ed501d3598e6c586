"""`create_server`: the SDK's lowlevel `Server` wired to a Celery app's tools.

Server tier: the wiring and the lifespan only. Creating tasks lives in `creation`, the
`tasks/*` handlers in `handlers`, what a request's envelope says in `envelope`, and the state
they share in `service`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from celery import Celery
from celery import _state as celery_state
from mcp import types
from mcp.server.lowlevel import Server

from mcp_celery._version import __version__
from mcp_celery.binding import AppBinding
from mcp_celery.protocol import TASKS_EXTENSION
from mcp_celery.server import creation, handlers, limits, listen
from mcp_celery.server.envelope import RequestContext
from mcp_celery.server.handlers import TaskIdParams, UpdateTaskParams
from mcp_celery.server.service import TaskService
from mcp_celery.settings import Settings

__all__ = ["create_server"]


def create_server(app: Celery, settings: Settings | None = None, *, name: str | None = None) -> Server[Any]:
    """An MCP server for every tool registered on `app` (build it after importing the job module).

    Raises:
        ConfigurationError: the app cannot back MCP tasks (e.g. its result backend is not Redis).
    """
    # This process never waits on a Celery result with AsyncResult.get(). Telling Celery so
    # stops its Redis backend from SUBSCRIBE-ing to every task the server queues (and never
    # unsubscribing until the result arrives): two commands and a growing channel set per task.
    celery_state._set_task_join_will_block(True)  # type: ignore[attr-defined]
    service = TaskService(AppBinding.create(app, settings or Settings()))

    @asynccontextmanager
    async def lifespan(_: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        async with service.running():
            yield {}

    async def list_tools(ctx: RequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(s.to_wire()) for s in service.tools.values()])

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
    _add_handlers(server, service)
    server.extensions[TASKS_EXTENSION] = {}
    return server


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

    server.add_request_handler("tools/call", types.CallToolRequestParams, guard(call_tool))
    server.add_request_handler("tasks/get", TaskIdParams, guard(tasks_get))
    server.add_request_handler("tasks/update", UpdateTaskParams, guard(tasks_update))
    server.add_request_handler("tasks/cancel", TaskIdParams, guard(tasks_cancel))
    server.add_request_handler(
        "subscriptions/listen", types.SubscriptionsListenRequestParams, guard(subscriptions_listen)
    )
