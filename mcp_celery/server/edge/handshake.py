"""What a client of the initialize era declared at `initialize`, carried across stateless HTTP requests.

Server tier. Over Streamable HTTP every request is a stateless POST (`mcp_celery.server.http`): a
client on the 2025-06-18 or 2025-11-25 handshake declares its capabilities and `clientInfo` once, in
`initialize`, and each later `tools/call` reaches a connection that saw none of it. A task it created
recorded capabilities `{}` (misleading `mcp-celery top` and the logs), and its inline window was an
unknown client's. So the answer to `initialize` carries an `Mcp-Session-Id` that holds the declaration
itself, `mcs1.` and the base64url of `{"clientInfo", "capabilities"}`, which such a client sends back
on every later request, as the transport requires; `declared` reads it there. Nothing is kept on the
server, so any replica reads it, after a restart too.

It is the client's own word, as a declaration in a request would be, and grants nothing: a plain
call's task may ask anything whatever it declared, and a window only fits the client's timeout. The
server still cannot send such a client requests (no stream stays open), so its questions come back in
the task handle; the record says what the client declared.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["HEADER", "PREFIX", "declared", "session_id", "with_session_id"]

#: The transport's session header (lower case, as ASGI and Starlette give it).
HEADER = "mcp-session-id"
#: How every session id this server issues starts (a version, for a later format).
PREFIX = "mcs1."
#: The longest session id issued; past it, only the names of the declared capabilities are kept.
MAX_CHARS = 2048

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


def session_id(body: bytes) -> str | None:
    """The session id for the answer to `body`: None unless it is an `initialize` request."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    info, capabilities = params.get("clientInfo"), params.get("capabilities")
    capabilities = capabilities if isinstance(capabilities, dict) else {}
    kept = _encode({"clientInfo": info, "capabilities": capabilities})
    if len(kept) > MAX_CHARS:  # a huge declaration: what it declares, without the details
        kept = _encode({"clientInfo": info, "capabilities": {name: {} for name in capabilities}})
    return kept if len(kept) <= MAX_CHARS else None


def declared(header: str | None) -> dict[str, Any] | None:
    """`{"clientInfo", "capabilities"}` as the client declared them at `initialize`, from its session id
    (None: no session id, or one this server did not issue)."""
    if not header or not header.startswith(PREFIX):
        return None
    text = header.removeprefix(PREFIX)
    try:
        found = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        return None
    return found if isinstance(found, dict) else None


def with_session_id(send: Send, value: str) -> Send:
    """`send`, adding the session header to the start of the answer."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (HEADER.encode(), value.encode())]
        await send(message)

    return sending


def _encode(value: dict[str, Any]) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str).encode()
    return PREFIX + base64.urlsafe_b64encode(text).rstrip(b"=").decode()
