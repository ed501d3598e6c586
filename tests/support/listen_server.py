"""A tiny SEP-2663 server on the mcp lowlevel `Server` that pushes `notifications/tasks` over
`subscriptions/listen` (which mcp-celery's own server does not serve yet), to test the client's listen path.

Its tasks finish after `FINISH_AFTER_S` and advertise a one-minute `pollIntervalMs`, so a client that sees
the end well within a minute was woken by a push, not by a poll. `gets` counts `tasks/get` calls.
Its task ids start with `-h`, as one in 64 of ids made by `secrets.token_urlsafe` (ours, FastMCP's) start
with `-`: a client must take them as ids, never as options.

In-process: `Client(ListenServer().server)`. Over Streamable HTTP, behind a static bearer token:
`python tests/support/listen_server.py PORT TOKEN`; it prints a `REFUSED` line for every other token it is
sent, so a test can tell an auth refusal from any other error (the SDK client reports both alike).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import mcp_types as types
import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

EXT = "io.modelcontextprotocol/tasks"
FINISH_AFTER_S = 0.5
Ctx = ServerRequestContext[Any, Any]


class TaskIdParams(types.RequestParams):
    task_id: str


class TaskNote(types.Notification[dict[str, Any], Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


class ListenServer:
    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.gets = 0
        self.changed = anyio.Event()
        self.server: Server[Any] = Server(
            "listen-fixture", lifespan=self._lifespan, on_list_tools=self._list_tools,
            on_call_tool=self._call_tool, on_subscriptions_listen=self._listen,
        )  # fmt: skip
        self.server.add_request_handler("tasks/get", TaskIdParams, self._get)
        self.server.extensions[EXT] = {}

    @asynccontextmanager
    async def _lifespan(self, _: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        async with anyio.create_task_group() as group:
            yield {"group": group}
            group.cancel_scope.cancel()

    async def _list_tools(self, ctx: Ctx, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="later", input_schema={"type": "object"})])

    async def _call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        task_id, now = f"-h{uuid.uuid4().hex}", datetime.now(UTC).isoformat()
        self.tasks[task_id] = {"taskId": task_id, "status": "working", "createdAt": now, "lastUpdatedAt": now,
                               "ttlMs": 600_000, "pollIntervalMs": 60_000}  # fmt: skip
        ctx.lifespan_context["group"].start_soon(self._finish, task_id)
        return {"resultType": "task", **self.tasks[task_id]}

    async def _finish(self, task_id: str) -> None:
        await anyio.sleep(FINISH_AFTER_S)
        result = {"content": [{"type": "text", "text": "pushed"}], "isError": False}
        self.tasks[task_id].update(status="completed", lastUpdatedAt=datetime.now(UTC).isoformat(), result=result)
        self.changed.set()

    async def _get(self, ctx: Ctx, params: TaskIdParams) -> dict[str, Any]:
        self.gets += 1
        if params.task_id not in self.tasks:
            raise MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return {"resultType": "complete", **self.tasks[params.task_id]}

    async def _listen(
        self, ctx: Ctx, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        ids = [t for t in (params.notifications.model_extra or {}).get("taskIds") or [] if t in self.tasks]
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        ack = types.SubscriptionsAcknowledgedNotificationParams(
            notifications=types.SubscriptionFilter.model_validate({"taskIds": ids}), _meta=meta
        )
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(params=ack), related_request_id=ctx.request_id
        )
        while any(self.tasks[t]["status"] == "working" for t in ids):
            await self.changed.wait()
            self.changed = anyio.Event()
        for task_id in ids:
            note = TaskNote(params={**self.tasks[task_id], "_meta": meta})
            await ctx.session.send_notification(note, related_request_id=ctx.request_id)  # type: ignore[arg-type]
        return types.SubscriptionsListenResult(_meta=meta)


#: The line the HTTP server prints (unbuffered, before its HTTP 401 goes out) for each token it refuses.
REFUSED = "refused bearer token {token!r}"


class StaticToken:
    """A `TokenVerifier` that accepts one token and says which others it refused."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if token != self.token:
            print(REFUSED.format(token=token), flush=True)
            return None
        return AccessToken(token=token, client_id="tests", scopes=[])


if __name__ == "__main__":
    port, token = int(sys.argv[1]), sys.argv[2]
    url = f"http://127.0.0.1:{port}"
    auth = AuthSettings(issuer_url=url, resource_server_url=f"{url}/mcp", validate_token_resource=False)
    app = ListenServer().server.streamable_http_app(
        stateless_http=True, json_response=True, auth=auth, token_verifier=StaticToken(token)
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
