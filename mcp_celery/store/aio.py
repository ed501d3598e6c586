"""The server's shell over the store: asyncio redis-py.

Writes that change what `tasks/get` shows also PUBLISH on the task's event channel, in the same
round trip, as the worker's writes do.

Round trips: `read` (the whole of `tasks/get`) is one HGETALL on the record; `create` is one
pipeline (HSET and EXPIRE, plus the owner's index under a quota; with a call's claim, one script instead
of the HSET and EXPIRE, and on a cluster one round trip more).

Acknowledged means replicated, when asked (`mcp_celery.store.replication`): an answer and a cancel
run in one pipeline with a WAIT for the replicas, and `confirm_replicated` does the same for a new
task once its job is queued, on a connection that finds the task's record there. Fewer replicas in
time raise `NotReplicated`, after the client has asked the sentinels for the primary again.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, cast

import redis.asyncio as aioredis

from mcp_celery.store import scripts
from mcp_celery.store.artifacts import ArtifactMeta
from mcp_celery.store.commands import AsyncPipelined, is_cluster, publish_command, queue_script
from mcp_celery.store.connect import AsyncRedis, rediscover_primary_async
from mcp_celery.store.ended import STREAM_MAXLEN, EndedEntry
from mcp_celery.store.replication import NotOnPrimary, NotReplicated, check_replicas, queue_wait
from mcp_celery.store.schema import FIELD, Durability, Keys, Lifetimes, TaskRecord, as_text, decode_hash

__all__ = ["AsyncStore", "CallClaim", "CancelOutcome", "JobMarks", "NotReplicated"]

#: What a cancel found: a job not started yet (now cancelled), a started one (told), or an ended task.
CancelOutcome = Literal["unstarted", "parked", "started", "ended"]


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


class CallClaim(NamedTuple):
    """A call's claim on its idempotency key or dedupe window (`Keys.idempotency_key`, `Keys.recent_call`):
    `value` held there for `lifetime_ms`, unless another claim is; `replacing`: one found stale, taken over."""

    key: str
    value: str
    lifetime_ms: int
    replacing: str = ""


class JobMarks(NamedTuple):
    """What the reaper reads of a watched task: its tool and its deadlines (ms; None: not set)."""

    tool: str
    alive_ms: int | None
    taken_ms: int | None
    parked_ms: int | None


class AsyncStore:
    """The server's view of the store."""

    def __init__(
        self, client: AsyncRedis, keys: Keys, lifetimes: Lifetimes, durability: Durability | None = None
    ) -> None:
        self.redis = client
        self.keys = keys
        self.lifetimes = lifetimes
        self.durability = durability or Durability()
        publish = publish_command(client)
        #: Whether the scripts add endings to the ended stream (not on a cluster: `mcp_celery.store.ended`).
        self.streams = not is_cluster(client)
        self._answer = client.register_script(scripts.publishing(scripts.ANSWER, publish))
        self._freeze = client.register_script(scripts.publishing(scripts.FREEZE, publish))
        self._cancel = client.register_script(scripts.publishing(scripts.CANCEL, publish))
        self._output_read = client.register_script(scripts.OUTPUT_READ)
        self._claim_call = client.register_script(scripts.CLAIM_CALL)
        self._release_call = client.register_script(scripts.RELEASE_CALL)
        self._claimed_create = AsyncPipelined(client, [client.register_script(scripts.CLAIM_AND_CREATE)])
        self._cluster = is_cluster(client)
        self._pipelined = AsyncPipelined(client, [self._answer, self._cancel])

    async def create(
        self,
        record: TaskRecord,
        *,
        index: bool = False,
        check_at_ms: int | None = None,
        then: Sequence[tuple[str, tuple[Any, ...]]] = (),
        claim: CallClaim | None = None,
    ) -> str | None:
        """Write the record, so that `tasks/get` succeeds before the job is queued.

        `index` also adds the task to its owner's set (only kept when a per-principal quota is set).
        `check_at_ms`: when a server looks for the job's message if no job has started by then
        (the task waits in `live` with that score; JOB_START replaces it with the heartbeat's).
        `then` are more commands for the same round trip, run after the record's (the job's
        message, when the broker is this Redis database: see `server.publish`).
        `claim`: taken with the record (in its round trip on one Redis server, just before on a cluster):
        when another call holds it, the record is not written, nor `then` run, and its claim is returned.
        """
        if claim is not None and self._cluster:  # the claim's key is in a slot of its own
            if (held := await self.claim_call(claim)) is not None:
                return held
            claim = None
        key = self.keys.task(record.task_id)

        def build(pipe: Any) -> None:
            if claim is None:
                pipe.hset(key, mapping=dict(record.to_hash()))
                pipe.expire(key, self.lifetimes.live_s)
            if check_at_ms is not None:  # with a claim held by another call: an entry dropped when looked at
                pipe.zadd(self.keys.live(), {record.task_id: check_at_ms})
            if index:
                owned = self.keys.owner_tasks(record.owner)
                pipe.zadd(owned, {record.task_id: record.created_ms})
                pipe.expire(owned, self.lifetimes.live_s)
            if claim is not None:  # the record, then the message, as below, but only if this call takes the claim
                fields = _pairs(record.to_hash())
                message = [part for name, args in then for part in (name, len(args), *args)]
                claimed = [*claim[1:], self.lifetimes.live_s, len(fields) // 2, *fields, *message]
                queue_script(pipe, self._claimed_create.scripts[0], [claim.key, key], claimed)
                return
            for name, args in then:
                getattr(pipe, name)(*args)

        replies = await self._claimed_create(build)
        held = replies[-1] if claim is not None else None
        return None if held is None else as_text(held)

    async def claim_call(self, claim: CallClaim) -> str | None:
        """Take `claim` unless another claim holds its key: None when this one does now, else the claim held
        (`scripts.CLAIM_CALL`)."""
        held = await self._claim_call(keys=[claim.key], args=list(claim[1:]))
        return None if held is None else as_text(held)

    async def release_call(self, key: str, claim: str) -> None:
        """Drop `claim` from `key` while it holds it (its task could not be created)."""
        await self._release_call(keys=[key], args=[claim])

    async def owned(self, owner: str) -> list[tuple[str, TaskRecord | None]]:
        """Every task in the owner's set with its record: two round trips in all."""
        raw_ids = await self.redis.zrange(self.keys.owner_tasks(owner), 0, -1)
        ids = [as_text(i) for i in raw_ids if isinstance(i, bytes | str)]
        return list(zip(ids, await self.read_many(ids), strict=True))

    async def disown(self, owner: str, task_ids: list[str]) -> None:
        await self.redis.zrem(self.keys.owner_tasks(owner), *task_ids)

    async def read(self, task_id: str, *, confirmed: bool = False) -> TaskRecord | None:
        """The record (with the job's progress and outcome), in one round trip.

        `confirmed`, with `Durability.min_replicas`: read in one pipeline with a WAIT, so that what it
        shows is on enough replicas (a primary that Sentinel replaced while it stalled shows writes
        it is about to drop, and lacks the new primary's).

        Raises:
            NotReplicated: `confirmed`, and too few replicas confirmed in time.
        """
        key = self.keys.task(task_id)
        if not (confirmed and self.durability.min_replicas):
            raw = await self.redis.hgetall(key)  # type: ignore[misc]
            return TaskRecord.from_hash(task_id, decode_hash(raw))

        def build(pipe: Any) -> None:
            pipe.hgetall(key)
            queue_wait(pipe, self.durability)

        raw, replicas = await self._pipelined(build)
        await self._check_replicas("the task's state", replicas)
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

    async def freeze(
        self, task_id: str, frozen: str, channel: str | None = None, ended: EndedEntry | None = None
    ) -> dict[str, Any] | None:
        """Freeze `frozen` as the terminal state unless one already is; returns the frozen one.

        `channel`: the task whose listeners hear of it (a workflow member's: its MCP task's).
        `ended`: an ending no job reports (its worker was lost), added to the ended stream if this
        call froze it (not on a cluster).
        """
        keys = [self.keys.task(task_id), self.keys.events(channel or task_id)]
        args: list[Any] = [frozen]
        if ended is not None and self.streams:
            keys.append(self.keys.ended())
            args += [STREAM_MAXLEN, *ended.to_args()]
        stored = await self._freeze(keys=keys, args=args)
        return json.loads(stored) if stored else None

    async def answer(
        self, task_id: str, answers: Mapping[str, str], now_ms: int, channel: str | None = None
    ) -> tuple[list[str], str | None]:
        """Store answers to outstanding requests and wake the job; returns the keys taken (still
        outstanding), and the signature that resumes the job (kombu JSON) when it was parked and
        this call answered its last open request: the caller sends it (`resumed`).

        `channel`: the task whose listeners hear of it (a workflow member's: its MCP task's).

        Raises:
            NotReplicated: the answers are stored on the primary, but not on enough replicas in time.
        """
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.bell(task_id)]
        keys.append(self.keys.events(channel or task_id))
        taken, resume = await self._replicated(
            "the answer", self._answer, keys, [now_ms, self.lifetimes.live_s, *_pairs(answers)]
        )
        return [as_text(key) for key in taken], None if resume is None else as_text(resume)

    async def resumed(self, task_id: str, check_at_ms: int | None) -> None:
        """A parked job's message is sent again: watch for it as for a new task's (the reaper's first look)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self.keys.parked(), task_id)
            if check_at_ms is None:
                pipe.zrem(self.keys.live(), task_id)  # no queue to look into: nothing to watch until the job starts
            else:
                pipe.zadd(self.keys.live(), {task_id: check_at_ms})
            await pipe.execute()

    async def request_cancel(
        self,
        task_id: str,
        now_ms: int,
        cancelled_before_start: str,
        cancelled_while_parked: str,
        channel: str | None = None,
    ) -> CancelOutcome | None:
        """Record a cancel (one script, atomic with the job's start and its parking) and tell listeners.

        A job that has not started is cancelled at once: `cancelled_before_start` (a frozen view, JSON)
        becomes the task's terminal state, and no worker will run the job; so is a parked one, with
        `cancelled_while_parked`. A started job finds the flag at its next checkpoint (the bell wakes
        one that waits). None: no such record.

        Raises:
            NotReplicated: the cancel is recorded on the primary, but not on enough replicas in time.
        """
        keys = [self.keys.task(task_id), self.keys.bell(task_id), self.keys.events(channel or task_id)]
        ttl_s = self.lifetimes.ttl_s
        args: list[str | int] = [now_ms, self.lifetimes.live_s, cancelled_before_start, cancelled_while_parked]
        args.append(ttl_s or "")
        if self.streams:  # a cancel at once is the task's ending: the ended stream hears of it
            keys.append(self.keys.ended())
            args += ["1", STREAM_MAXLEN, task_id]
        outcome = await self._replicated("the cancel", self._cancel, keys, args)
        if outcome is None:
            return None
        found = cast(CancelOutcome, as_text(outcome))
        if found in ("unstarted", "parked"):
            await self.forget_live([task_id])  # its record is frozen: nothing left to watch
        return found

    async def confirm_replicated(self, task_id: str) -> None:
        """Wait until enough replicas have the new task (and, on the same Redis, its job's message).

        A write first, so that the WAIT on this connection covers everything the primary wrote before
        it, the record and the message queued since (WAIT counts a connection's last write that reached
        the replication stream): a PUBLISH on the task's channel, which Redis always passes on to its
        replicas and which changes nothing for listeners (they read the task again). This connection
        need not be the one that wrote the record: in a failover under load one can be on the old
        primary and one on the new, so the record must be where the WAIT runs.

        Raises:
            NotReplicated: not on enough replicas within the bounded wait.
            NotOnPrimary: the record is not on the primary this connection reached.
        """
        if not self.durability.min_replicas:
            return

        def build(pipe: Any) -> None:
            pipe.exists(self.keys.task(task_id))
            pipe.publish(self.keys.events(task_id), "created")
            queue_wait(pipe, self.durability)

        found, _, confirmed = await self._pipelined(build)
        if not found:
            await rediscover_primary_async(self.redis)
            raise NotOnPrimary("the task")
        await self._check_replicas("the task", confirmed)

    async def _replicated(self, what: str, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run `script`; with `Durability.min_replicas`, in one pipeline with the WAIT for the replicas."""
        if not self.durability.min_replicas:
            return await script(keys=keys, args=args)

        def build(pipe: Any) -> None:
            queue_script(pipe, script, keys, args)
            queue_wait(pipe, self.durability)

        reply, confirmed = await self._pipelined(build)
        await self._check_replicas(what, confirmed)
        return reply

    async def _check_replicas(self, what: str, confirmed: Any) -> None:
        try:
            check_replicas(what, confirmed, self.durability)
        except NotReplicated:
            await rediscover_primary_async(self.redis)  # this connection may be on a replaced primary
            raise

    async def overdue(self, now_ms: int, limit: int = 200) -> list[str]:
        """Ids of running tasks whose heartbeat ran out before `now_ms`."""
        found = await self.redis.zrangebyscore(self.keys.live(), "-inf", now_ms, start=0, num=limit)
        return [as_text(task_id) for task_id in found if isinstance(task_id, bytes | str)]

    async def job_marks(self, task_ids: list[str]) -> dict[str, JobMarks]:
        """Each task's tool, heartbeat deadline (None: no job started yet), `taken` deadline (None: no
        worker has taken its message, or the job started) and parked deadline (None: not parked); one
        round trip, no record: left out."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hmget(self.keys.task(task_id), [FIELD.TOOL, FIELD.ALIVE_UNTIL, FIELD.TAKEN, FIELD.PARKED])
            replies = await pipe.execute()
        return {
            task_id: JobMarks(as_text(tool), *(int(mark) if mark else None for mark in marks))
            for task_id, (tool, *marks) in zip(task_ids, replies, strict=True)
            if tool is not None
        }

    async def recheck(self, task_ids: list[str], at_ms: int) -> None:
        """Look at these tasks again at `at_ms` (XX: a task whose job has ended meanwhile stays out)."""
        if task_ids:
            await self.redis.zadd(self.keys.live(), dict.fromkeys(task_ids, at_ms), xx=True)

    async def forget_live(self, task_ids: list[str]) -> None:
        """Watch these tasks no more (ended, or nothing left to watch); a parked one leaves the index too."""
        if task_ids:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.live(), *task_ids)
                pipe.zrem(self.keys.parked(), *task_ids)
                await pipe.execute()

    async def state_secret(self) -> bytes:
        """The deployment's key for signing `requestState`s: made by the first server that asks, then kept."""
        key = self.keys.state_secret()
        await self.redis.set(key, secrets.token_bytes(32), nx=True)
        secret = await self.redis.get(key)
        if not isinstance(secret, bytes) or len(secret) < 32:
            raise RuntimeError(f"Redis key {key!r} does not hold a 32-byte secret; delete it to make a new one")
        return secret

    async def watch_sent(self, task_id: str, check_at_ms: int) -> None:
        """Look for a workflow member's message at `check_at_ms` unless its job started by then (`SyncStore`'s)."""
        await self.redis.zadd(self.keys.live(), {task_id: check_at_ms}, nx=True)

    async def claim_merge(self, task_id: str, now_ms: int) -> bool:
        """True for the one caller that launches the workflow's merge step (`mcp_celery.core.workflows`)."""
        return bool(await self.redis.hsetnx(self.keys.task(task_id), FIELD.MERGING, now_ms))  # type: ignore[misc]

    async def artifact_bytes(self, task_id: str, meta: ArtifactMeta, start: int, end: int) -> bytes | None:
        """Bytes `start` to `end` (exclusive, within its size) of an artifact kept in Redis, from the one key
        or the chunks they lie in, in one round trip; None when a key is gone (the task expired meanwhile)."""
        keys, spans = meta.redis_keys(self.keys, task_id), meta.spans(start, end)
        async with self.redis.pipeline(transaction=False) as pipe:
            if not meta.chunk_bytes:  # one key: an empty range of it must tell whether it is there
                pipe.exists(keys[0])
            for index, first, stop in spans:
                pipe.getrange(keys[index], first, stop - 1)
            found = await pipe.execute()
        if not meta.chunk_bytes and not found.pop(0):
            return None
        # A chunk holds all the bytes a span asks of it: fewer means it is gone (GETRANGE of no key is empty).
        if any(len(data) != stop - first for data, (_, first, stop) in zip(found, spans, strict=True)):
            return None
        return b"".join(found)

    async def output(self, task_id: str) -> tuple[int, bytes]:
        """The task's live output as stored, and the bytes dropped before it (`mcp_celery.store.output`)."""
        keys = [self.keys.task(task_id), self.keys.output(task_id)]
        dropped, data = await self._output_read(keys=keys)
        return int(dropped or 0), bytes(data or b"")

    async def records_exist(self, task_ids: Sequence[str]) -> list[bool]:
        """Whether each task's record exists (the artifact sweep's question), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.exists(self.keys.task(task_id))
            return [bool(found) for found in await pipe.execute()]

    async def approval(self, approval_id: str) -> tuple[str, str, dict[str, Any]] | None:
        """The task, input request key and request (as asked) an approval id stands for, or None."""
        raw = await self.redis.get(self.keys.approval(approval_id))
        if raw is None:
            return None
        where = json.loads(as_text(raw))
        return str(where["task"]), str(where["key"]), dict(where["request"])

    async def approval_ids(self, limit: int = 500) -> list[str]:
        """The approval ids asked, oldest first (an index: the record says whether each is still open)."""
        ids = cast(list[bytes | str], await self.redis.zrange(self.keys.approvals(), 0, limit - 1))
        return [as_text(i) for i in ids]

    async def forget_approvals(self, approval_ids: Sequence[str]) -> None:
        """Take decided, withdrawn and expired approvals out of the index (their id keys expire on their own)."""
        if approval_ids:
            await self.redis.zrem(self.keys.approvals(), *approval_ids)

    async def stored_answer(self, task_id: str, key: str) -> dict[str, Any] | None:
        """The answer taken for input request `key` (kept while the task lives), or None."""
        raw = await self.redis.hget(self.keys.answers(task_id), key)  # type: ignore[misc]
        return None if raw is None else cast(dict[str, Any], json.loads(as_text(raw)))

    async def count_sign_in(self, source: str, window_s: int) -> int:
        """Count one sign-in attempt from `source` before it is checked; returns the attempts in its window.

        Increment-then-compare: of a burst, each attempt gets its own count, so no more than the limit
        are ever checked (`forgive_sign_in` takes a successful one back).
        """
        key = self.keys.sign_ins(source)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key, 0, ex=window_s, nx=True)  # the window starts at the first attempt (Redis 6: no EXPIRE NX)
            pipe.incr(key)
            _, count = await pipe.execute()
        return int(count)

    async def forgive_sign_in(self, source: str, window_s: int) -> None:
        """Take back the attempt `count_sign_in` counted, for a sign-in that succeeded."""
        key = self.keys.sign_ins(source)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(key, 0, ex=window_s, nx=True)  # never a counter without expiry, should the window end just now
            pipe.decr(key)
            await pipe.execute()

    async def put_session(self, digest: str, session: str, ttl_s: int) -> None:
        """Keep a session (JSON) under its id's digest for `ttl_s` seconds."""
        await self.redis.set(self.keys.session(digest), session, ex=max(ttl_s, 1))

    async def session(self, digest: str) -> str | None:
        """The session kept under `digest`, or None (never opened, ended or expired)."""
        raw = await self.redis.get(self.keys.session(digest))
        return None if raw is None else as_text(raw)

    async def end_session(self, digest: str) -> None:
        await self.redis.delete(self.keys.session(digest))

    async def keep_sign_in_attempt(self, state_digest: str, attempt: bytes, ttl_s: int) -> None:
        """Keep an OpenID Connect sign-in attempt until the person comes back from the provider, or `ttl_s`."""
        await self.redis.set(self.keys.sign_in_attempt(state_digest), attempt, ex=ttl_s)

    async def take_sign_in_attempt(self, state_digest: str) -> bytes | None:
        """The attempt kept under `state_digest`, removed in the same command: a second take gets None."""
        found = await self.redis.getdel(self.keys.sign_in_attempt(state_digest))
        return found.encode() if isinstance(found, str) else found

    async def delete(self, task_id: str) -> None:
        await self.redis.delete(self.keys.task(task_id), self.keys.output(task_id))

    async def aclose(self) -> None:
        """Close the client and its connections: a pool given to the client (a bounded one) is not closed
        with it by default, and its connections would be left to the garbage collector."""
        if is_cluster(self.redis):
            await self.redis.aclose()  # closes every node's connections
        else:
            await cast(aioredis.Redis, self.redis).aclose(close_connection_pool=True)
