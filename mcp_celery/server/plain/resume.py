"""The `requestState` of an MRTR round that asks a running task's questions in a plain `tools/call`.

Server tier. A client without the tasks extension that declared elicitation (or sampling, roots)
gets a running job's questions as an MRTR round (`resultType: "input_required"`); its retry of the
same `tools/call` carries the answers and this state, which names the task to resume. The state is
attacker-controlled, so it is signed (HMAC-SHA256 with a key kept in Redis, shared by every
replica and surviving restarts) and bound to the tool, the caller and an expiry; the task is
looked up with the usual owner check as well.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from mcp.shared.exceptions import MCPError

from mcp_celery.protocol import INVALID_PARAMS

__all__ = ["PREFIX", "issue", "task_of"]

#: How every state this server issues starts (a version, for a later format).
PREFIX = "mcp-celery.1."


def issue(secret: bytes, *, task_id: str, tool: str, principal: str, expires_ms: int) -> str:
    """A signed state naming `task_id`, good for `tool` and `principal` until `expires_ms`."""
    payload = json.dumps({"t": task_id, "n": tool, "p": _fingerprint(principal), "e": expires_ms}).encode()
    body = _b64(payload)
    return f"{PREFIX}{body}.{_b64(_sign(secret, body))}"


def task_of(secret: bytes, state: str, *, tool: str, principal: str, now_ms: int) -> str:
    """The task id a state names.

    Raises:
        MCPError: -32602 when the state was not issued by this deployment, is for another tool or
            caller, or has expired (the client should call the tool afresh, or use task_status).
    """
    try:
        body, signature = state.removeprefix(PREFIX).split(".")
        valid = state.startswith(PREFIX) and hmac.compare_digest(_unb64(signature), _sign(secret, body))
        claims = json.loads(_unb64(body)) if valid else {}
    except (ValueError, binascii.Error):
        claims = {}
    if not claims or claims.get("n") != tool or claims.get("p") != _fingerprint(principal):
        raise MCPError(INVALID_PARAMS, "requestState was not issued by this server for this tool and caller")
    if not isinstance(claims.get("e"), int) or claims["e"] < now_ms:
        raise MCPError(
            INVALID_PARAMS, "requestState has expired; call the tool again, or follow its task with task_status"
        )
    return str(claims["t"])


def _fingerprint(principal: str) -> str:
    # The state is readable by the client: it carries a digest of the principal, never the name.
    return hashlib.sha256(principal.encode()).hexdigest()[:32]


def _sign(secret: bytes, body: str) -> bytes:
    return hmac.new(secret, body.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
