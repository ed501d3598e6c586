"""The client half of `io.modelcontextprotocol/tasks` (SEP-2663) on the SDK's `ClientExtension` seam.

With it in `Client(extensions=[...])`, a plain `await client.call_tool(...)` against any SEP-2663 server
returns the final `CallToolResult`: a `ResultClaim` on `resultType: "task"` waits the task out (answering
its input requests through the client's callbacks). `notifications/tasks` reach the waiting handles through
a `NotificationBinding`; pass `extension.message_handler` as the client's `message_handler` (`connect()`
does) so the extension also sees which task ids a `subscriptions/listen` was acknowledged for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TextIO

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, SubscriptionsAcknowledgedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery import idempotency
from mcp_celery.client._handle import TaskHandle, final_result, start_task
from mcp_celery.client._journal import Journal, ServerTarget
from mcp_celery.client._retries import DEFAULT_RETRIES, Retries, RetryingTransport
from mcp_celery.client._state import InputHandler, TaskState
from mcp_celery.protocol import TASKS_EXTENSION, CreateTaskResult, TaskNotificationParams

__all__ = ["TasksExtension", "connect"]


class TasksExtension(ClientExtension):
    """Task support for an SDK `Client`.

    Args:
        journal: where started tasks are recorded (with `target`); None keeps no journal.
        target: the server these tasks live on, as written to the journal.
        input_handler: answers input requests; default: the `Client`'s elicitation/sampling/roots callbacks.
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        journal: Journal | None = None,
        target: ServerTarget | None = None,
        input_handler: InputHandler | None = None,
    ) -> None:
        self.state = TaskState(journal, target, input_handler)

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [
            ResultClaim(
                result_type="task",
                model=CreateTaskResult,
                resolve=self._resolve,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            )
        ]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [
            NotificationBinding(method="notifications/tasks", params_type=TaskNotificationParams, handler=self._on_task)
        ]

    async def message_handler(self, message: Any) -> None:
        """A `Client(message_handler=...)` that notes listen acknowledgements naming task ids."""
        if isinstance(message, SubscriptionsAcknowledgedNotification):
            task_ids = (message.params.notifications.model_extra or {}).get("taskIds") or []
            self.state.acknowledged([str(t) for t in task_ids])

    async def start(self, client: Client, tool: str, arguments: dict[str, Any] | None = None) -> TaskHandle:
        """Start `tool` as a task; see `start_task`."""
        return await start_task(client, self.state, tool, arguments)

    def attach(self, client: Client, task_id: str, tool: str | None = None) -> TaskHandle:
        """A handle on a task started earlier (by this process or another), e.g. from the journal."""
        return TaskHandle(client.session, self.state, task_id, tool)

    async def _on_task(self, params: TaskNotificationParams) -> None:
        self.state.push(params.detailed())

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        state = self.state
        if state.journal is not None and state.target is not None:
            state.journal.record(created.task_id, state.target, ctx.tool_name, None, created.status)
        handle = TaskHandle(ctx.session, state, created.task_id, ctx.tool_name)
        return final_result(await handle.wait())


#: HTTP statuses of a request refused before JSON-RPC, noted in `TaskState.http_refusal`.
REFUSALS = (401, 403, 413, 421)


class _Connected(Client):
    """A `Client` that, once connected, tells its `TasksExtension` whether the server honours idempotency keys
    (`mcp_celery.client._retries`: only then is a call whose reply was lost sent again)."""

    async def __aenter__(self) -> Client:
        client = await super().__aenter__()
        honoured = idempotency.SERVER_EXTENSION in (client.server_capabilities.extensions or {})
        for extension in self.extensions or ():
            if isinstance(extension, TasksExtension):
                extension.state.keys_honoured = honoured
        return client


@asynccontextmanager
async def _http_transport(url: str, token: str | None, state: TaskState, retries: Retries) -> AsyncIterator[Any]:
    """Streamable HTTP with a bearer token and calls sent again when their reply is lost (`RetryingTransport`);
    the transport leaves a client it was given open, so close it here."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    sender = RetryingTransport(httpx2.AsyncHTTPTransport(), retries, lambda: state.keys_honoured)

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code in REFUSALS:
            state.http_refusal = response.status_code

    # The SDK transport's own timeouts: a response stream (listen) may stay open a long time.
    timeout = httpx2.Timeout(30.0, read=300.0)
    hooks = {"response": [note_refusal]}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, transport=sender, event_hooks=hooks) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def connect(
    target: ServerTarget,
    extension: TasksExtension,
    *,
    token: str | None = None,
    errlog: TextIO = sys.stderr,
    retries: Retries = DEFAULT_RETRIES,
    **client_options: Any,
) -> Client:
    """An SDK `Client` for `target` with `extension` wired in (claims, notifications, listen acks).

    A stdio target runs its command in `target.cwd` with this process's environment, its stderr going to
    `errlog`; `token` is sent as a bearer token to an HTTP target. Over HTTP every `tools/call` carries an
    idempotency key, and one whose reply is lost is sent again with it as `retries` says, when the server
    honours keys (`mcp_celery.client._retries`; `NO_RETRIES`: never). `client_options` go
    to `Client` (`elicitation_callback=`, `sampling_callback=`, `list_roots_callback=`, ...).
    An HTTP 401, 403, 413 or 421 (which the SDK reports as -32603 "Server returned an error
    response") is noted in `extension.state.http_refusal`.
    """
    if target.url is not None:
        transport: Any = _http_transport(target.url, token, extension.state, retries)
    else:
        command, *args = target.command
        params = StdioServerParameters(command=command, args=args, cwd=target.cwd, env=dict(os.environ))
        transport = stdio_client(params, errlog=errlog)
    return _Connected(transport, extensions=[extension], message_handler=extension.message_handler, **client_options)
