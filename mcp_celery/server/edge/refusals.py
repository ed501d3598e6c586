"""The SDK's bare HTTP refusals, reworded at the server's own HTTP boundary so each says what to do.

Server tier. An ASGI middleware around the Streamable HTTP app; it rewrites two answers the SDK
gives before any handler of ours runs, and passes everything else through untouched (the Host and
Origin checks are not the SDK's: `mcp_celery.server.edge.hosts` words its own refusals):

* 413 `Request body too large` names MCP_CELERY_MAX_REQUEST_BYTES and its value;
* the answer to JSON that is not a JSON-RPC message (`[1, 2]`, `{"foo": 1}`, `"str"`) becomes
  HTTP 400 with -32600 `Invalid Request`, as stdio answers it: the initialize-era transport gives
  -32602 and pydantic's whole validation dump, links included; the 2026-07-28 one gives -32600
  with a message of its own.

Each rewrite matches the SDK's exact status and body, so an SDK that words them differently is
passed through as it is (and the tests that pin these answers fail). Only responses with one of
those statuses are buffered, and only until their body is complete; streams are never held.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_celery.protocol import INVALID_PARAMS
from mcp_celery.settings import Settings

__all__ = ["INVALID_REQUEST_MESSAGE", "SDK_REFUSALS", "RewordedRefusals"]

#: The message of -32600 for a body that is JSON but not a JSON-RPC message, as over stdio.
INVALID_REQUEST_MESSAGE = "Invalid Request"
#: The 2026-07-28 transport's message for a body that is JSON but not one JSON-RPC message.
SDK_NOT_ONE_MESSAGE = "Body must be a single JSON-RPC request or notification object"
#: The plain-text refusals of the SDK that are reworded, by HTTP status.
SDK_REFUSALS = {413: b"Request body too large"}

Reword = Callable[[bytes, Headers], bytes | None]
#: The statuses whose responses are held until complete, to be reworded.
REWORDED_STATUSES = frozenset({400, *SDK_REFUSALS})


class RewordedRefusals:
    """ASGI middleware: rewrites the SDK's 400 (not JSON-RPC) and 413 answers; see the module docstring."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        limit = settings.max_request_bytes
        self._rewords: dict[int, Reword] = {
            400: _not_json_rpc,
            413: _exact(
                SDK_REFUSALS[413],
                lambda _: f"Request body too large: the limit is {limit} bytes (MCP_CELERY_MAX_REQUEST_BYTES)",
            ),
        }

    def reword(self, status: int, body: bytes, request_headers: Headers) -> bytes | None:
        """The body to send instead of the SDK's `body` for `status`, or None to send it as it is."""
        reword = self._rewords.get(status)
        return None if reword is None else reword(body, request_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _Rewording(send, self, Headers(scope=scope)))


class _Rewording:
    """The `send` of one request: holds a response with a status to reword until its body is complete."""

    def __init__(self, send: Send, refusals: RewordedRefusals, request_headers: Headers) -> None:
        self._send = send
        self._refusals = refusals
        self._request_headers = request_headers
        self._start: Message | None = None
        self._body = bytearray()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in REWORDED_STATUSES:
            self._start = message
            return
        if self._start is None or message["type"] != "http.response.body":
            await self._send(message)
            return
        self._body.extend(message.get("body", b""))
        if message.get("more_body", False):
            return
        start, body = self._start, bytes(self._body)
        self._start = None
        reworded = self._refusals.reword(start["status"], body, self._request_headers)
        if reworded is None:
            await self._send(start)
            await self._send({"type": "http.response.body", "body": body})
            return
        await self._send({**start, "headers": _with_length(start.get("headers", []), len(reworded))})
        await self._send({"type": "http.response.body", "body": reworded})


def _exact(sdk_body: bytes, text: Callable[[Headers], str]) -> Reword:
    """A rewrite of the plain-text refusal whose body is exactly `sdk_body`."""

    def reword(body: bytes, request_headers: Headers) -> bytes | None:
        return text(request_headers).encode() if body == sdk_body else None

    return reword


def _not_json_rpc(body: bytes, _: Headers) -> bytes | None:
    """-32600 `Invalid Request` for either transport's answer to JSON that is not one JSON-RPC message:
    the legacy one's envelope-validation error (-32602, id null, a pydantic dump), the 2026-07-28
    one's -32600 with its own wording."""
    try:
        reply: Any = json.loads(body)
    except ValueError:
        return None
    error = reply.get("error") if isinstance(reply, dict) else None
    if not (isinstance(error, dict) and reply.get("id") is None):
        return None
    code, message = error.get("code"), str(error.get("message", ""))
    legacy = code == INVALID_PARAMS and message.startswith("Validation error:")
    if not (legacy or (code == INVALID_REQUEST and message == SDK_NOT_ONE_MESSAGE)):
        return None
    invalid = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": INVALID_REQUEST_MESSAGE}}
    return json.dumps(invalid, separators=(",", ":")).encode()


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name.lower() != b"content-length"]
    return [*kept, (b"content-length", str(length).encode())]
