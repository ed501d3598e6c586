"""The server's shell over the store: asyncio redis-py.

Writes that change what `tasks/get` shows also PUBLISH on the task's event channel, in the same
round trip, as the worker's writes do.

Round trips: `read` (the whole of `tasks/get`) is one HGETALL on the record; `create` is one
pipeline (HSET and EXPIRE, plus the owner's index under a quota).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from mcp_celery.store import scripts
from mcp_celery.store.schema import FIELD, Keys, Lifetimes, TaskRecord, as_text, decode_hash

__all__ = ["AsyncStore"]


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


class AsyncStore:
    """The server's view of the store."""

    def __init__(self, client: aioredis.Redis, keys: Keys, lifetimes: Lifetimes) -> None:
        self.redis = client
        self.keys = keys
        self.lifetimes = lifetimes
        self._answer = client.register_script(scripts.ANSWER)
        self._freeze = client.register_script(scripts.FREEZE)

    async def create(
        self,
        record: TaskRecord,
        *,
        index: bool = False,
        check_at_ms: int | None = None,
        then: Sequence[tuple[str, tuple[Any, ...]]] = (),
    ) -> None:
        """Write the record, so that `tasks/get` succeeds before the job is queued.

        `index` also adds the task to its owner's set (only kept when a per-principal quota is set).
        `check_at_ms`: when a server looks for the job's message if no job has started by then
        (the task waits in `live` with that score; JOB_START replaces it with the heartbeat's).
        `then` are more commands for the same round trip, run after the record's (the job's
        message, when the broker is this Redis database: see `server.publish`).
        """
        key = self.keys.task(record.task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict(record.to_hash()))  # type: ignore[arg-type]
            pipe.expire(key, self.lifetimes.live_s)
            if check_at_ms is not None:
                pipe.zadd(self.keys.live(), {record.task_id: check_at_ms})
            if index:
                owned = self.keys.owner_tasks(record.owner)
                pipe.zadd(owned, {record.task_id: record.created_ms})
                pipe.expire(owned, self.lifetimes.live_s)
            for name, args in then:
                getattr(pipe, name)(*args)
            await pipe.execute()

    async def owned(self, owner: str) -> list[tuple[str, TaskRecord | None]]:
        """Every task in the owner's set with its record: two round trips in all."""
        raw_ids = await self.redis.zrange(self.keys.owner_tasks(owner), 0, -1)
        ids = [as_text(i) for i in raw_ids if isinstance(i, bytes | str)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hgetall(self.keys.task(task_id))
            replies = await pipe.execute()
        return [
            (task_id, TaskRecord.from_hash(task_id, decode_hash(raw)))
            for task_id, raw in zip(ids, replies, strict=True)
        ]

    async def disown(self, owner: str, task_ids: list[str]) -> None:
        await self.redis.zrem(self.keys.owner_tasks(owner), *task_ids)

    async def read(self, task_id: str) -> TaskRecord | None:
        """The record (with the job's progress and outcome), in one round trip."""
        raw = await self.redis.hgetall(self.keys.task(task_id))  # type: ignore[misc]
        return TaskRecord.from_hash(task_id, decode_hash(raw))

    async def read_many(self, task_ids: Sequence[str]) -> list[TaskRecord | None]:
        """Several records in one round trip (a listen stream's look at its tasks)."""
        if not task_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hgetall(self.keys.task(task_id))
            raws = await pipe.execute()
        return [TaskRecord.from_hash(task_id, decode_hash(raw)) for task_id, raw in zip(task_ids, raws, strict=True)]

    async def freeze(self, task_id: str, frozen: str) -> dict[str, Any] | None:
        """Freeze `frozen` as the terminal state unless one already is; returns the frozen one."""
        stored = await self._freeze(keys=[self.keys.task(task_id), self.keys.events(task_id)], args=[frozen])
        return json.loads(stored) if stored else None

    async def answer(self, task_id: str, answers: Mapping[str, str], now_ms: int) -> int:
        """Store answers to outstanding requests and wake the job; returns how many were taken."""
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.bell(task_id), self.keys.events(task_id)]
        return int(await self._answer(keys=keys, args=[now_ms, self.lifetimes.live_s, *_pairs(answers)]))

    async def request_cancel(self, task_id: str, now_ms: int) -> None:
        """Durable cancel flag first (the job checks it), then the bell wakes a waiting job; listeners hear of it."""
        bell = self.keys.bell(task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hsetnx(self.keys.task(task_id), FIELD.CANCEL, now_ms)
            pipe.lpush(bell, "cancel")
            pipe.expire(bell, self.lifetimes.live_s)
            pipe.publish(self.keys.events(task_id), "cancel")
            await pipe.execute()

    async def overdue(self, now_ms: int, limit: int = 200) -> list[str]:
        """Ids of running tasks whose heartbeat ran out before `now_ms`."""
        found = await self.redis.zrangebyscore(self.keys.live(), "-inf", now_ms, start=0, num=limit)
        return [as_text(task_id) for task_id in found if isinstance(task_id, bytes | str)]

    async def job_marks(self, task_ids: list[str]) -> dict[str, tuple[str, int | None, int | None]]:
        """Each task's tool, heartbeat deadline (None: no job started yet) and `taken` deadline (None:
        no worker has taken its message, or the job started); one round trip, no record: left out."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hmget(self.keys.task(task_id), [FIELD.TOOL, FIELD.ALIVE_UNTIL, FIELD.TAKEN])
            replies = await pipe.execute()
        return {
            task_id: (as_text(tool), int(alive) if alive else None, int(taken) if taken else None)
            for task_id, (tool, alive, taken) in zip(task_ids, replies, strict=True)
            if tool is not None
        }

    async def recheck(self, task_ids: list[str], at_ms: int) -> None:
        """Look at these tasks again at `at_ms` (XX: a task whose job has ended meanwhile stays out)."""
        if task_ids:
            await self.redis.zadd(self.keys.live(), dict.fromkeys(task_ids, at_ms), xx=True)

    async def forget_live(self, task_ids: list[str]) -> None:
        if task_ids:
            await self.redis.zrem(self.keys.live(), *task_ids)

    async def delete(self, task_id: str) -> None:
        await self.redis.delete(self.keys.task(task_id))

    async def aclose(self) -> None:
        await self.redis.aclose()
