"""Waiting for a Celery result from the async server, on one shared pub/sub connection.

Server tier: the process's one Redis listener. Celery's Redis backend PUBLISHes every state it
stores on the task's meta key; a synchronous `tools/call` subscribes to that channel on the
server's single listener connection, queues the job, and sleeps until a ready state arrives.
No connection per call and no polling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mcp_celery.status import READY_STATES

__all__ = ["ResultWaiter"]

logger = logging.getLogger(__name__)


class ResultWaiter:
    def __init__(self, client: aioredis.Redis, decode_meta: Callable[[bytes | None], dict[str, Any] | None]) -> None:
        self._client = client
        self._decode = decode_meta
        self._pubsub = client.pubsub()
        self._events: dict[bytes, anyio.Event] = {}
        self._subscribed = anyio.Event()  # set once the listener has a channel to read

    async def run(self) -> None:
        """The listener loop; runs in the server's lifespan task group until cancelled."""
        while True:
            await self._subscribed.wait()
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError):
                logger.warning("result listener lost its Redis connection; resubscribing", exc_info=True)
                await anyio.sleep(0.5)
                await self._resubscribe()
                continue
            if message is None or message.get("type") != "message":
                continue
            event = self._events.get(bytes(message["channel"]))
            meta = self._decode(message["data"])
            if event is not None and (meta or {}).get("status") in READY_STATES:
                event.set()

    async def subscribe(self, channel: bytes) -> anyio.Event:
        event = self._events[channel] = anyio.Event()
        await self._pubsub.subscribe(channel)
        self._subscribed.set()
        return event

    async def unsubscribe(self, channel: bytes) -> None:
        self._events.pop(channel, None)
        try:
            await self._pubsub.unsubscribe(channel)
        except (RedisError, OSError):
            logger.warning("could not unsubscribe from %r", channel, exc_info=True)

    async def ready_now(self, channel: bytes) -> bool:
        """Whether the result is already stored (it may have been published before we subscribed)."""
        raw = await self._client.get(channel)
        meta = self._decode(raw.encode() if isinstance(raw, str) else raw)
        return (meta or {}).get("status") in READY_STATES

    async def aclose(self) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _resubscribe(self) -> None:
        try:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = self._client.pubsub()
            if self._events:
                await self._pubsub.subscribe(*self._events)
        except (RedisError, OSError):
            logger.warning("result listener could not resubscribe", exc_info=True)
