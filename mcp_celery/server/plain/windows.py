"""How long a plain call may hold its client: the inline window, below the calling client's own timeout.

Server tier, for the plain call (`call`) and `task_status(wait_seconds=...)` (`lifecycle`). A
client that gives up on a call before its window ends loses the task handle: its model sees a
timeout error, no task id, and a retry starts a second job. So the window is the tool's (or
MCP_CELERY_INLINE_S) only when it fits the client; otherwise the client's own, below its default
per-call timeout, as measured for the client libraries agents are built on
(docs/guides/clients.md). Clients are told apart by the name in their `clientInfo`; most Python
libraries send the Python SDK's default name, `mcp`, so that entry takes the shortest timeout
measured among them (openai-agents' 5 s). A client not in the table gets `UNKNOWN_WINDOW_S`,
chosen from the same table: a shorter window costs the model one `task_status` call, a longer
one can cost it the task. `MCP_CELERY_CLIENT_WINDOWS` adds clients and overrides entries (`*`:
clients not in the table).

A request that carries a progress token from a client known to reset its timeout on progress
(`MCP_CELERY_PROGRESS_CLIENTS`) keeps the tool's own window: the keepalive notifications of the
plain call hold such a client for as long as the window lasts.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_celery.core.tools import ToolSpec
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.settings import Settings

__all__ = ["KNOWN_CLIENTS", "UNKNOWN_WINDOW_S", "Client", "KnownClient", "client_of", "client_window_s", "window_s"]


@dataclass(frozen=True)
class KnownClient:
    """A client's default per-call timeout as measured, and the window kept below it."""

    timeout_s: float
    window_s: float
    #: Who sends this clientInfo name, and where the timeout comes from.
    who: str


#: Clients by their `clientInfo` name (measured 2026-12-06 through each library's own tool layer).
KNOWN_CLIENTS: dict[str, KnownClient] = {
    "mcp": KnownClient(
        5.0,
        4.0,
        "the Python SDK's default clientInfo, sent by openai-agents (client_session_timeout_seconds=5), "
        "pydantic-ai, strands-agents, agent-framework, fastmcp and langchain-mcp-adapters",
    ),
}
#: The window of a client not in the table: below the shortest default timeout measured (5 s).
UNKNOWN_WINDOW_S = 4.0


@dataclass(frozen=True)
class Client:
    """What a request says about its client that bears on the window."""

    name: str | None
    progress_token: bool


def client_of(ctx: RequestContext) -> Client:
    """The client of the request, as far as its window goes."""
    return Client(envelope.client_name(ctx), envelope.progress_token(ctx) is not None)


def client_window_s(settings: Settings, name: str | None) -> float:
    """The longest a call may hold the client named `name` (clientInfo), whatever the tool's window."""
    own = settings.client_windows
    if name is not None and name in own:
        return own[name]
    known = KNOWN_CLIENTS.get(name or "")
    if known is not None:
        return known.window_s
    return own.get("*", UNKNOWN_WINDOW_S)


def window_s(settings: Settings, spec: ToolSpec | None, client: Client) -> float:
    """How long a plain call of the tool (or a `task_status` wait) holds this client.

    The tool's inline_s (else MCP_CELERY_INLINE_S), capped at the client's window unless the
    client resets its timeout on the progress notifications this request asked for.
    """
    own = spec.inline_s if spec is not None and spec.inline_s is not None else settings.inline_s
    if client.progress_token and client.name is not None and client.name in settings.progress_client_names:
        return own
    return min(own, client_window_s(settings, client.name))
