"""Retry-safe tool calls: a fresh idempotency key with every `tools/call`, the same call sent again when its
reply is lost (issue 47).

MCP 2026-07-28 has no stream resumption: when the connection breaks or times out before a `tools/call`'s
reply, the client cannot know whether the server created the task, and calling again could run the job a
second time. A server that honours idempotency keys (it says so with the `mcp-celery/idempotency`
capability) answers a call repeated with the same key with the first call's task instead.

Over Streamable HTTP, `connect()` builds its HTTP client on `RetryingTransport`:

* every `tools/call` carries a key: the one its `_meta` names (`start_task` puts a fresh one there and
  journals it), else a fresh `Idempotency-Key` header (an SDK `client.call_tool`);
* when the server honours keys, a call whose connection breaks or times out before its whole reply
  arrived, or that a gateway answers with 502, 503 or 504, is sent again as it was, key and all, up to
  `Retries.attempts` more times with a doubling pause. A server that does not say it honours keys is never
  sent a call twice: there a second send could run the job twice.

Over stdio a broken connection is the server process gone; nothing is sent again there.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2

from mcp_celery import idempotency

__all__ = ["DEFAULT_RETRIES", "NO_RETRIES", "Retries", "RetryingTransport", "call_key"]

logger = logging.getLogger(__name__)

#: A call whose request failed so, or whose reply was cut so, may have reached the server: send it again.
RETRIED_ERRORS = (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError)
#: A gateway's answer for a call it gave up on (the server may have taken it): send it again.
RETRIED_STATUSES = frozenset({502, 503, 504})
_ENCODING_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class Retries:
    """How often, and after what pauses, a call whose reply was lost is sent again.

    Args:
        attempts: sends after the first (0: a call is never sent twice).
        backoff_s: the pause before the first of them; each next one doubles it, up to `max_backoff_s`
            (each pause varies by up to 20%, so that clients cut off together do not come back together).
    """

    attempts: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("retries: attempts and pauses cannot be negative")

    def pause_s(self, attempt: int) -> float:
        """The pause before send number `attempt` + 2 (attempt 0: the first send again)."""
        pause: float = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        return pause * random.uniform(0.8, 1.2)


#: The retries `connect()` uses unless told otherwise.
DEFAULT_RETRIES = Retries()
#: A call is never sent twice.
NO_RETRIES = Retries(attempts=0)


def call_key(request: httpx2.Request) -> str | None:
    """The idempotency key of a `tools/call` POST (its `_meta`'s, else its header's), given it a fresh one (as
    the header) when it has none; None for any other request."""
    if request.method != "POST" or request.headers.get("mcp-method") not in (None, "tools/call"):
        return None
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    if not isinstance(body, dict) or body.get("method") != "tools/call":
        return None
    meta = (body.get("params") or {}).get("_meta")
    key = meta.get(idempotency.META) if isinstance(meta, dict) else None
    if isinstance(key, str):
        return key
    if idempotency.HEADER not in request.headers:
        request.headers[idempotency.HEADER] = idempotency.new_key()
    return request.headers[idempotency.HEADER]


class RetryingTransport(httpx2.AsyncBaseTransport):
    """Gives every `tools/call` a key, and sends a keyed call again when its reply is lost (see the module).

    Args:
        inner: the transport that sends.
        retries: how often and when.
        honoured: whether the server said it honours keys (known once connected).
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport, retries: Retries, honoured: Callable[[], bool]) -> None:
        self.inner = inner
        self.retries = retries
        self.honoured = honoured

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key = call_key(request)
        if key is None or not (self.retries.attempts and self.honoured()):
            return await self.inner.handle_async_request(request)
        for attempt in range(self.retries.attempts + 1):
            last = attempt == self.retries.attempts
            try:
                response = await self._whole(await self.inner.handle_async_request(request), request)
                if last or response.status_code not in RETRIED_STATUSES:
                    return response
                lost: Any = f"HTTP {response.status_code}"
            except RETRIED_ERRORS as exc:
                if last:
                    raise
                lost = exc
            pause = self.retries.pause_s(attempt)
            logger.warning(
                "the reply to a tools/call was lost (%s); sending it again with its idempotency key in %.2f s "
                "(%d of %d)",
                lost,
                pause,
                attempt + 1,
                self.retries.attempts,
            )
            await anyio.sleep(pause)
        raise AssertionError("unreachable")

    @staticmethod
    async def _whole(response: httpx2.Response, request: httpx2.Request) -> httpx2.Response:
        """A JSON reply read to its end here, so that a reply cut short counts as lost; a stream as it comes."""
        if not response.headers.get("content-type", "").startswith("application/json"):
            return response
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        # Read means decoded: the new response carries the bytes as they are, without the old encoding.
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _ENCODING_HEADERS]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            content=body,
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
