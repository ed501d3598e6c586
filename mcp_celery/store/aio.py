"""The server's shell over the store: asyncio redis-py.

Writes that change what `tasks/get` shows also PUBLISH on the task's event channel (the key of
its Celery result meta, where Celery publishes every state it stores), in the same round trip.

Round trips: `read` (the whole of `tasks/get`) is one pipeline of two commands, HGETALL on the
record and GET on Celery's result meta. `create` is one pipeline of three.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from mcp_celery.store import scripts
from mcp_celery.store.schema import FIELD, Keys, Lifetimes, TaskRecord, as_text, decode_hash

__all__ = ["AsyncStore"]


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


class AsyncStore:
    """The server's view of the store."""

    def __init__(
        self, client: aioredis.Redis, keys: Keys, lifetimes: Lifetimes, meta_key: Callable[[str], Any]
    ) -> None:
        self.redis = client
        self.keys = keys
        self.lifetimes = lifetimes
        self.meta_key = meta_key
        self._answer = client.register_script(scripts.ANSWER)
        self._freeze = client.register_script(scripts.FREEZE)

    async def create(
        self,
        record: TaskRecord,
        pending_meta: bytes | str,
        *,
        index: bool = False,
        then: Sequence[tuple[str, tuple[Any, ...]]] = (),
    ) -> None:
        """Write the record and a PENDING Celery meta, so `tasks/get` succeeds before the job is queued.

        `index` also adds the task to its owner's set (only kept when a per-principal quota is set).
        `then` are more commands for the same round trip, run after the record's (the job's
        message, when the broker is this Redis database: see `server.publish`).
        """
        key = self.keys.task(record.task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict(record.to_hash()))  # type: ignore[arg-type]
            pipe.expire(key, self.lifetimes.live_s)
            pipe.set(self.meta_key(record.task_id), pending_meta, ex=self.lifetimes.ttl_s)
            if index:
                owned = self.keys.owner_tasks(record.owner)
                pipe.zadd(owned, {record.task_id: record.created_ms})
                pipe.expire(owned, self.lifetimes.live_s)
            for name, args in then:
                getattr(pipe, name)(*args)
            await pipe.execute()

    async def owned(self, owner: str) -> list[tuple[str, TaskRecord | None, bytes | None]]:
        """Every task in the owner's set with its record and Celery meta: two round trips in all."""
        raw_ids = await self.redis.zrange(self.keys.owner_tasks(owner), 0, -1)
        ids = [as_text(i) for i in raw_ids if isinstance(i, bytes | str)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hgetall(self.keys.task(task_id))
                pipe.get(self.meta_key(task_id))
            replies = await pipe.execute()
        return [
            (task_id, TaskRecord.from_hash(task_id, decode_hash(raw)), meta)
            for task_id, raw, meta in zip(ids, replies[::2], replies[1::2], strict=True)
        ]

    async def disown(self, owner: str, task_ids: list[str]) -> None:
        await self.redis.zrem(self.keys.owner_tasks(owner), *task_ids)

    async def read(self, task_id: str) -> tuple[TaskRecord | None, bytes | None]:
        """The record and Celery's raw result meta, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.task(task_id))
            pipe.get(self.meta_key(task_id))
            raw, meta = await pipe.execute()
        return TaskRecord.from_hash(task_id, decode_hash(raw)), meta

    async def freeze(self, task_id: str, frozen: str) -> dict[str, Any] | None:
        """Freeze `frozen` as the terminal state unless one already is; returns the frozen one."""
        stored = await self._freeze(keys=[self.keys.task(task_id), self.meta_key(task_id)], args=[frozen])
        return json.loads(stored) if stored else None

    async def answer(self, task_id: str, answers: Mapping[str, str], now_ms: int) -> int:
        """Store answers to outstanding requests and wake the job; returns how many were taken."""
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.bell(task_id), self.meta_key(task_id)]
        return int(await self._answer(keys=keys, args=[now_ms, self.lifetimes.live_s, *_pairs(answers)]))

    async def request_cancel(self, task_id: str, now_ms: int) -> None:
        """Durable cancel flag first (the job checks it), then the bell wakes a waiting job; listeners hear of it."""
        bell = self.keys.bell(task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hsetnx(self.keys.task(task_id), FIELD.CANCEL, now_ms)
            pipe.lpush(bell, "cancel")
            pipe.expire(bell, self.lifetimes.live_s)
            pipe.publish(self.meta_key(task_id), "cancel")
            await pipe.execute()

    async def overdue(self, now_ms: int, limit: int = 200) -> list[str]:
        """Ids of running tasks whose heartbeat ran out before `now_ms`."""
        found = await self.redis.zrangebyscore(self.keys.live(), "-inf", now_ms, start=0, num=limit)
        return [as_text(task_id) for task_id in found if isinstance(task_id, bytes | str)]

    async def forget_live(self, task_ids: list[str]) -> None:
        if task_ids:
            await self.redis.zrem(self.keys.live(), *task_ids)

    async def delete(self, task_id: str) -> None:
        await self.redis.delete(self.keys.task(task_id), self.meta_key(task_id))

    async def aclose(self) -> None:
        await self.redis.aclose()
