"""Redis access for task records: one sync shell for the worker, one async shell for the server.

Both shells queue the same commands (pipelines have one API in redis-py's sync and
asyncio clients) and decode with the same pure functions, so the two sides cannot drift.
Every multi-key state change that must be atomic is a Lua script.

Round trips: `read` (the whole of `tasks/get`) is one pipeline of two commands, HGETALL on
the record and GET on Celery's result meta. `create` is one pipeline of three.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from mcp_celery.keys import INPUT_FIELD_PREFIX, Keys
from mcp_celery.record import TaskRecord, as_text, decode_hash

__all__ = ["AsyncStore", "SyncStore"]

# KEYS[1] task hash, KEYS[2] answers hash, KEYS[3] bell list.
# ARGV[1] now (ms), ARGV[2] expiry of answers and bell (s), then key/answer pairs.
# Stores each answer whose key is still outstanding (first answer wins), removes the key
# from the outstanding set and rings the bell once. Returns how many answers were taken.
_ANSWER_LUA = """
local taken = 0
for i = 3, #ARGV, 2 do
  if redis.call('HDEL', KEYS[1], 'in:' .. ARGV[i]) == 1 then
    redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
    taken = taken + 1
  end
end
if taken > 0 then
  redis.call('HSET', KEYS[1], 'updated', ARGV[1])
  redis.call('LPUSH', KEYS[3], 'answer')
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return taken
"""

# KEYS[1] task hash. ARGV[1] frozen terminal view (JSON).
# Freezes the first terminal state observed and returns the frozen one.
_FREEZE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSETNX', KEYS[1], 'final', ARGV[1])
return redis.call('HGET', KEYS[1], 'final')
"""

# KEYS[1] task hash, KEYS[2] answers hash. ARGV[1] now (ms), then key/request pairs.
# Posts each request that has no stored answer yet (a redelivered job replays answers
# instead of asking again). Returns {cancel-requested, answers...} in ARGV order.
_POST_LUA = """
local out = {redis.call('HGET', KEYS[1], 'cancel') or false}
for i = 2, #ARGV, 2 do
  local answer = redis.call('HGET', KEYS[2], ARGV[i])
  if not answer then
    redis.call('HSET', KEYS[1], 'in:' .. ARGV[i], ARGV[i + 1])
  end
  out[#out + 1] = answer or false
end
redis.call('HSET', KEYS[1], 'updated', ARGV[1])
return out
"""

_JOB_FIELDS = ("tool", "caps", "sync", "cancel", "first", "created", "ttl", "poll")


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


class _Base:
    def __init__(self, keys: Keys, meta_key: Any) -> None:
        self.keys = keys
        self._meta_key = meta_key  # Celery's backend.get_key_for_task

    def meta_key(self, task_id: str) -> Any:
        return self._meta_key(task_id)


class AsyncStore(_Base):
    """The server's view of the store."""

    def __init__(self, client: aioredis.Redis, keys: Keys, meta_key: Any) -> None:
        super().__init__(keys, meta_key)
        self.redis = client
        self._answer = client.register_script(_ANSWER_LUA)
        self._freeze = client.register_script(_FREEZE_LUA)

    async def create(
        self, record: TaskRecord, meta: bytes | str, meta_expires_s: int | None, keep_s: int, *, index: bool = False
    ) -> None:
        """Write the record and a PENDING Celery meta, so `tasks/get` succeeds before the job is queued.

        `index` also adds the task to its owner's set (only kept when a per-principal quota is set).
        """
        key = self.keys.task(record.task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict(record.to_hash()))  # type: ignore[arg-type]
            pipe.expire(key, keep_s)
            pipe.set(self.meta_key(record.task_id), meta, ex=meta_expires_s or None)
            if index:
                owned = self.keys.owner_tasks(record.owner)
                pipe.zadd(owned, {record.task_id: record.created_ms})
                pipe.expire(owned, keep_s)
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
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.task(task_id))
            pipe.get(self.meta_key(task_id))
            raw, meta = await pipe.execute()
        return TaskRecord.from_hash(task_id, decode_hash(raw)), meta

    async def freeze(self, task_id: str, frozen: str) -> dict[str, Any] | None:
        stored = await self._freeze(keys=[self.keys.task(task_id)], args=[frozen])
        return json.loads(stored) if stored else None

    async def answer(self, task_id: str, answers: Mapping[str, str], now_ms: int, keep_s: int) -> int:
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.bell(task_id)]
        return int(await self._answer(keys=keys, args=[now_ms, keep_s, *_pairs(answers)]))

    async def request_cancel(self, task_id: str, now_ms: int, keep_s: int) -> None:
        """Durable cancel flag first (the job checks it), then the bell wakes a waiting job."""
        bell = self.keys.bell(task_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hsetnx(self.keys.task(task_id), "cancel", now_ms)
            pipe.lpush(bell, "cancel")
            pipe.expire(bell, keep_s)
            await pipe.execute()

    async def delete(self, task_id: str) -> None:
        await self.redis.delete(self.keys.task(task_id), self.meta_key(task_id))


class SyncStore(_Base):
    """The worker's view of the store. Its client must have no socket timeout (it blocks on BLPOP)."""

    def __init__(self, client: redis.Redis, keys: Keys, meta_key: Any) -> None:
        super().__init__(keys, meta_key)
        self.redis = client
        self._post = client.register_script(_POST_LUA)

    def job_fields(self, task_id: str, keep_s: int) -> dict[str, str] | None:
        """The record fields a starting job needs, or None when the job was not started through MCP.

        Also restarts the record's lifetime, so that a job that waited long in the queue still
        has `keep_s` (TTL plus the longest job) ahead of it: a running task never expires.
        """
        key = self.keys.task(task_id)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(key, list(_JOB_FIELDS))
            pipe.expire(key, keep_s)  # a no-op when there is no record
            values, _ = pipe.execute()
        fields = {name: as_text(v) for name, v in zip(_JOB_FIELDS, values, strict=True) if v is not None}
        return fields if "tool" in fields else None

    def cancel_requested(self, task_id: str) -> bool:
        return bool(self.redis.hexists(self.keys.task(task_id), "cancel"))

    def post_inputs(self, task_id: str, requests: Mapping[str, str], now_ms: int) -> tuple[bool, dict[str, str]]:
        """Publish input requests; returns (cancel requested, answers already stored by key)."""
        keys = [self.keys.task(task_id), self.keys.answers(task_id)]
        reply = self._post(keys=keys, args=[now_ms, *_pairs(requests)])
        answers = {k: as_text(v) for k, v in zip(requests, reply[1:], strict=True) if v}
        return bool(reply[0]), answers

    def poll_answers(self, task_id: str, wire_keys: list[str]) -> tuple[bool, dict[str, str]]:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hexists(self.keys.task(task_id), "cancel")
            pipe.hmget(self.keys.answers(task_id), wire_keys)
            cancel, values = pipe.execute()
        return bool(cancel), {k: as_text(v) for k, v in zip(wire_keys, values, strict=True) if v}

    def withdraw_inputs(self, task_id: str, wire_keys: list[str]) -> None:
        self.redis.hdel(self.keys.task(task_id), *[INPUT_FIELD_PREFIX + k for k in wire_keys])

    def ring(self, task_id: str) -> None:
        """Pass a wake-up on: BLPOP wakes one waiter per ring, and a duplicate delivery may be waiting too."""
        self.redis.lpush(self.keys.bell(task_id), "relay")

    def wait_bell(self, task_id: str, timeout_s: float) -> bool:
        """Block until the bell rings (answer or cancel) or the timeout passes; True if it rang."""
        # BLPOP takes a float timeout; 0 would mean forever, so never pass it.
        return self.redis.blpop([self.keys.bell(task_id)], timeout=max(timeout_s, 0.001)) is not None

    def job_ended(self, task_id: str, keep_s: int | None, *, asked: bool) -> None:
        """Let the record live for the TTL from now on, now that the job is over (None: for ever).

        Celery writes the result meta just after this with the same expiry, so the record
        never outlives the meta (which would make a finished task read as queued).
        """
        keys = [self.keys.task(task_id)] + ([self.keys.answers(task_id), self.keys.bell(task_id)] if asked else [])
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                if keep_s is None:
                    pipe.persist(key)
                else:
                    pipe.expire(key, keep_s)
            pipe.execute()
