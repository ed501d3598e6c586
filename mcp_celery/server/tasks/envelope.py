"""What a request's envelope says: declared capabilities, the Mcp-Name header, the caller.

Server tier. Also the one place the protocol errors every handler may raise are built: the
-32021 of a request that does not declare what it needs, and the -32602 of a task that is
unknown, expired or someone else's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery import idempotency
from mcp_celery.protocol import (
    CAPABILITY_FOR_METHOD,
    CLIENT_CAPABILITIES_META,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    MISSING_CAPABILITY_MESSAGE,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    TASK_NOT_FOUND_MESSAGE,
    TASKS_EXTENSION,
    missing_capability_data,
)
from mcp_celery.server.edge import handshake
from mcp_celery.server.edge.auth import request_principal

__all__ = [
    "NAME_MISMATCH_MESSAGE",
    "RequestContext",
    "check_task_name",
    "client_capabilities",
    "client_name",
    "idempotency_key",
    "input_responses",
    "missing_capability",
    "principal",
    "progress_token",
    "require_tasks_extension",
    "task_not_found",
    "tasks_declared",
]

RequestContext = ServerRequestContext[Any, Any]

#: The -32020 message of a tasks/* request whose Mcp-Name header names another task.
NAME_MISMATCH_MESSAGE = "Mcp-Name header does not match params.taskId"


def tasks_declared(ctx: RequestContext) -> bool:
    """Whether *this* request declares the tasks extension (never inferred from earlier ones)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False  # clients of the initialize era get the synchronous behaviour
    extensions = client_capabilities(ctx).get("extensions")
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def require_tasks_extension(ctx: RequestContext) -> None:
    """Raises the -32021 error unless the request declares the tasks extension."""
    if not tasks_declared(ctx):
        raise missing_capability()


def client_capabilities(ctx: RequestContext) -> dict[str, Any]:
    """The client capabilities of this request (2026-07-28 `_meta`), or of the session (initialize era: over
    stateless HTTP, as its `initialize` declared them, carried in its session id: `handshake`)."""
    meta = ctx.meta or {}
    raw = meta.get(CLIENT_CAPABILITIES_META)  # type: ignore[misc]
    if isinstance(raw, dict):
        return raw
    caps = ctx.session.client_capabilities
    if caps is not None:
        return caps.model_dump(by_alias=True, exclude_none=True, mode="json")
    found = (_declared(ctx) or {}).get("capabilities")
    return found if isinstance(found, dict) else {}


def _declared(ctx: RequestContext) -> dict[str, Any] | None:
    """What an initialize-era client declared at `initialize`, when its request carries the session id."""
    headers = getattr(ctx.request, "headers", None)
    return None if headers is None else handshake.declared(headers.get(handshake.HEADER))


def client_name(ctx: RequestContext) -> str | None:
    """The `clientInfo` name the client sent (2026-07-28 `_meta`, or the initialize handshake); None when unknown."""
    params = ctx.session.client_params
    if params is not None:
        return params.client_info.name
    info = (_declared(ctx) or {}).get("clientInfo")
    return str(info["name"]) if isinstance(info, dict) and isinstance(info.get("name"), str) else None


def progress_token(ctx: RequestContext) -> str | int | None:
    """The request's `_meta.progressToken`, when it asks for progress notifications."""
    meta: Mapping[str, Any] = ctx.meta or {}  # type: ignore[assignment]
    # The SDK hands `_meta` over with its TypedDict's key (`progress_token`); raw, it is `progressToken`.
    token = meta.get("progress_token", meta.get("progressToken"))
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def input_responses(params: Any) -> dict[str, Any]:
    """The request's `inputResponses` (MRTR answers) as plain JSON values, by key."""
    return {
        key: value.model_dump(by_alias=True, exclude_none=True, mode="json")
        if isinstance(value, pydantic.BaseModel)
        else value
        for key, value in (getattr(params, "input_responses", None) or {}).items()
    }


def idempotency_key(ctx: RequestContext, max_length: int) -> str | None:
    """The `tools/call`'s idempotency key: `_meta["mcp-celery/idempotencyKey"]`, or over HTTP the
    `Idempotency-Key` header (a bare value, or the IETF draft's quoted string); None without one.

    Raises:
        MCPError: -32602 for a key that is not a string, is empty or longer than `max_length`, or for a
            header and a `_meta` key that differ.
    """
    meta: Mapping[str, Any] = ctx.meta or {}  # type: ignore[assignment]
    in_meta = meta.get(idempotency.META)
    headers = getattr(ctx.request, "headers", None)
    header = None if headers is None else headers.get(idempotency.HEADER)
    in_header = None if header is None else idempotency.header_value(header)
    if in_meta is not None and in_header is not None and in_meta != in_header:
        raise MCPError(INVALID_PARAMS, f"the {idempotency.HEADER} header and _meta name two different keys")
    key = in_meta if in_meta is not None else in_header
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= max_length):
        raise MCPError(INVALID_PARAMS, f"an idempotency key is a string of 1 to {max_length} characters")
    return key


def check_task_name(ctx: RequestContext, task_id: str) -> None:
    """A tasks/* request's Mcp-Name header, when present, must name its task (-32020 otherwise)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return
    name = headers.get("mcp-name")
    if name is not None and decode_header_value(name) != task_id:
        raise MCPError(HEADER_MISMATCH, NAME_MISMATCH_MESSAGE)


def principal(ctx: RequestContext) -> str:
    """Who owns tasks created by this request: the verified token's principal over HTTP ("" with no
    authentication configured), the local user over stdio (which has no HTTP request)."""
    return request_principal(over_http=ctx.request is not None)


def missing_capability(request: Mapping[str, Any] | None = None, reason: str | None = None) -> MCPError:
    """The -32021 error: for the tasks extension, or for the capability an input `request` needs."""
    if request is None:
        return MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, MISSING_CAPABILITY_MESSAGE, missing_capability_data())
    capability = CAPABILITY_FOR_METHOD.get(str(request.get("method")), "roots")
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        reason or MISSING_CAPABILITY_MESSAGE,
        missing_capability_data({capability: {}}),
    )


def task_not_found() -> MCPError:
    """Unknown, expired and foreign tasks get this one error, so existence never leaks."""
    return MCPError(INVALID_PARAMS, TASK_NOT_FOUND_MESSAGE)
