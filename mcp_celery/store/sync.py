"""The worker's shell over the store: synchronous redis-py, used from inside running jobs.

The doorbell loops of a job waiting for answers or sleeping are in `sync_waits`, the workflow
writes in `sync_members`, the artifacts in `sync_artifacts`, the live output in `sync_output`, the
retries while Redis is away in `retry`.

With `Durability.min_replicas` (`mcp_celery.store.replication`), what a job decides on the server's
acknowledged writes waits for the replicas too: its question, giving up on it at the timeout, its
outcome, and its heartbeats. One that too few replicas confirm is taken again, as while Redis is
unreachable, so that a failover cannot keep the client's acknowledged answer and lose the job's
timeout before it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal, cast

import redis

from mcp_celery.protocol import now_ms
from mcp_celery.store import scripts
from mcp_celery.store.commands import SyncPipelined, is_cluster, publish_command, queue_publish, queue_script
from mcp_celery.store.connect import SyncRedis, rediscover_primary
from mcp_celery.store.deployment import WorkerPresence
from mcp_celery.store.ended import STREAM_MAXLEN, EndedEntry
from mcp_celery.store.replication import NotReplicated, check_replicas, queue_wait
from mcp_celery.store.retry import MIN_BLOCK_S, OUTCOME_RETRY_S, while_unreachable
from mcp_celery.store.schema import (
    FIELD,
    JOB_FIELDS,
    Durability,
    Keys,
    Lifetimes,
    TaskRecord,
    as_text,
)
from mcp_celery.store.sync_artifacts import ArtifactWrites
from mcp_celery.store.sync_members import MemberRecords
from mcp_celery.store.sync_output import OutputWrites
from mcp_celery.store.sync_waits import AnswerWait, DoorbellWaits

__all__ = ["MEMO_PREFIX", "MIN_BLOCK_S", "AnswerWait", "ParkOutcome", "SyncStore"]

logger = logging.getLogger(__name__)


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


#: The answers-hash field prefix of `JobContext.once`'s values (`JobContext.ask` refuses request keys with it).
MEMO_PREFIX = "once:"

#: What parking found: the job parked, every request answered meanwhile, or the task cancelled (or ended).
ParkOutcome = Literal["parked", "answered", "cancel"]

#: The progress a starting job shows (Celery's STARTED), as JOB_START stores it.
_STARTED = json.dumps({"status": "STARTED"})


class SyncStore(DoorbellWaits, MemberRecords, ArtifactWrites, OutputWrites):
    """The worker's view of the store. Its client must have no socket timeout (it blocks on BLPOP)."""

    def __init__(
        self, client: SyncRedis, keys: Keys, lifetimes: Lifetimes, durability: Durability | None = None
    ) -> None:
        self.redis = client
        self.keys = keys
        self.lifetimes = lifetimes
        self.durability = durability or Durability()
        self._publish = publish_command(client)
        #: Whether the scripts add endings to the ended stream (not on a cluster: `mcp_celery.store.ended`).
        self.streams = not is_cluster(client)
        self._post = self._script(scripts.POST_INPUTS)
        self._beat = self._script(scripts.BEAT)
        self._job_start = self._script(scripts.JOB_START)
        self._progress = self._script(scripts.PROGRESS)
        self._job_end = self._script(scripts.JOB_END)
        self._lost = self._script(scripts.LOST)
        self._taken = self._script(scripts.TAKEN)
        self._launch = self._script(scripts.LAUNCH)
        self._freeze = self._script(scripts.FREEZE)
        self._cancel = self._script(scripts.CANCEL)
        self._park = self._script(scripts.PARK)
        self._pipelined = SyncPipelined(
            client,
            [
                self._beat,
                self._job_start,
                self._job_end,
                self._lost,
                self._taken,
                self._progress,
                self._cancel,
                self._post,
                self._park,
            ],
        )

    def _script(self, text: str) -> redis.commands.core.Script:
        return self.redis.register_script(scripts.publishing(text, self._publish))

    def job_started(
        self,
        task_id: str,
        alive_for_ms: int,
        live_s: int | None = None,
        *,
        may_run_again: bool = False,
        retry_s: float = OUTCOME_RETRY_S,
    ) -> TaskRecord | None:
        """The record a starting job needs, or None when the job was not started through MCP.

        Also restarts the record's lifetime (`live_s`, default TTL plus the longest job), so that a
        job that waited long in the queue still has its whole run ahead of it (a running task never
        expires), beats once (alive for `alive_for_ms` from now) and shows the job running. A record
        whose heartbeat is set comes from an earlier delivery that started; unless `may_run_again`,
        nothing is written then. Tried again for up to `retry_s` while Redis is unreachable (restarting):
        the job cannot run without its record, and its message is acked already. Its listeners hear
        of the start from `announce_started`, a moment later.
        """
        keys = [self.keys.task(task_id)]
        lifetime = self.lifetimes.live_s if live_s is None else live_s
        # The lifetime the record got at creation (the TTL plus the longest job) still outlives this job
        # if the job waited less than that minus the job's own limit (a minute's margin): then its
        # expiry stays as it is, one command fewer; JOB_END sets the TTL from the job's end anyway.
        job_limit_s = lifetime - self.lifetimes.live_for(0)
        waited_ok_ms = max((self.lifetimes.live_s - job_limit_s) * 1000 - 60_000, -1)  # -1: renew it always
        again = "1" if may_run_again else ""

        def start() -> Any:
            # The heartbeat's deadline counts from this attempt, however long Redis was away.
            alive_until = now_ms() + alive_for_ms
            args: list[str | int] = [lifetime, alive_until, now_ms(), _STARTED, again, waited_ok_ms]

            def build(pipe: Any) -> None:
                pipe.zadd(self.keys.live(), {task_id: alive_until})  # before the script: see Keys.live
                queue_script(pipe, self._job_start, keys, args)

            return self._pipelined(build)[1]

        values = while_unreachable(task_id, "as the job starts", start, retry_s)
        fields = {name: as_text(v) for name, v in zip(JOB_FIELDS, values, strict=True) if v is not None}
        return TaskRecord.from_job_fields(task_id, fields) if FIELD.TOOL in fields else None

    def announce_started(self, channels: list[str]) -> None:
        """Tell these tasks' listeners (by their event channel's task id) that a job started; one round trip."""

        def build(pipe: Any) -> None:
            for channel in channels:
                queue_publish(pipe, self._publish, self.keys.events(channel), "started")

        self._pipelined(build)

    def count_run(self, task_id: str) -> int:
        """Count one more start of a job that runs again when its worker is lost; returns the count."""
        return int(self.redis.hincrby(self.keys.task(task_id), FIELD.RUNS, 1))

    def beat(self, task_ids: list[str], alive_until_ms: int, presence: WorkerPresence | None = None) -> None:
        """Heartbeat of running jobs: each stays `alive` until `alive_until_ms` (one round trip for all).

        `presence`: the beating process's own, kept as long (`mcp_celery.store.deployment`); the
        entries of processes gone a beat period ago are dropped from the set in the same round trip.
        """

        def build(pipe: Any) -> None:
            if presence is not None:
                period_ms = max(alive_until_ms - presence.beat_ms, 1)
                pipe.set(self.keys.worker(presence.worker_id), presence.to_json(), px=period_ms)
                pipe.zadd(self.keys.workers(), {presence.worker_id: alive_until_ms})
                pipe.zremrangebyscore(self.keys.workers(), "-inf", presence.beat_ms - period_ms)
            self._queue_beats(pipe, task_ids, alive_until_ms)

        # Confirmed too, with MIN_REPLICAS: beats that land on a primary Sentinel replaced are dropped
        # with it, and the new primary's servers would call the job lost; a beat the replicas did not
        # confirm makes the next one ask the sentinels for the primary again.
        self._replicated("the heartbeat", build)

    def _queue_beats(self, pipe: Any, task_ids: list[str], alive_until_ms: int) -> None:
        """Score the tasks in `live` by their new heartbeat deadline, then push it on in each record."""
        if task_ids:
            pipe.zadd(self.keys.live(), dict.fromkeys(task_ids, alive_until_ms))  # before the scripts: see Keys.live
        for task_id in task_ids:
            queue_script(pipe, self._beat, [self.keys.task(task_id)], [alive_until_ms])

    def mark_taken(self, task_id: str, taken_until_ms: int) -> bool:
        """A worker is about to ack the job's message early: watch the task until its job starts.

        False (nothing written): not an MCP task, or its job has started or ended already (a short job
        often has, by the time the worker's main process hears the pool took it). The mark first, then
        the task into `live` only if it was marked: both come before the ack, so a worker lost in
        between has not acked, and the broker hands the message out again.
        """
        marked = bool(self._taken(keys=[self.keys.task(task_id)], args=[taken_until_ms, "1"]))
        if marked:
            self.redis.zadd(self.keys.live(), {task_id: taken_until_ms})
        return marked

    def beat_taken(self, task_ids: list[str], taken_until_ms: int) -> list[str]:
        """Push the `taken` deadline of these tasks on (one round trip); returns those no longer to beat for.

        `live` is updated only where the task still is (XX): a task whose job ended meanwhile stays out.
        """

        def build(pipe: Any) -> None:
            if task_ids:
                pipe.zadd(self.keys.live(), dict.fromkeys(task_ids, taken_until_ms), xx=True)
            for task_id in task_ids:
                queue_script(pipe, self._taken, [self.keys.task(task_id)], [taken_until_ms, ""])

        written = self._pipelined(build)[1:] if task_ids else []
        return [task_id for task_id, ok in zip(task_ids, written, strict=True) if not ok]

    def progress(self, task_id: str, meta: Mapping[str, Any], channel: str | None = None) -> None:
        """Show the job's progress (`{"status": ..., "result": ...}`, as Celery's result meta).

        Best effort: while Redis is unreachable (restarting) the job goes on; its next progress shows.
        """
        keys = [self.keys.task(task_id), self.keys.events(channel or task_id)]
        try:
            self._progress(keys=keys, args=[json.dumps(meta, default=str), now_ms()])
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("task %s: Redis unreachable; this progress is not shown", task_id)

    def job_interrupted(self, task_id: str, at_ms: int, channel: str | None = None) -> None:
        """The job's process is being stopped mid-job: its heartbeat ends now, not a period later.

        Listeners hear of it at once (the ping makes servers read the task, which is then lost);
        an outcome stored meanwhile still wins, since a finished job is never lost.
        """

        def build(pipe: Any) -> None:
            self._queue_beats(pipe, [task_id], at_ms - 1)
            queue_publish(pipe, self._publish, self.keys.events(channel or task_id), "lost")

        self._pipelined(build)

    def note_lost_reason(self, task_ids: list[str], reason: str) -> None:
        """Say why these jobs' heartbeats may stop (a worker shutting down); no effect on a job that finishes."""

        def build(pipe: Any) -> None:
            for task_id in task_ids:
                queue_script(pipe, self._lost, [self.keys.task(task_id)], [reason])

        self._pipelined(build)

    def post_inputs(
        self, task_id: str, requests: Mapping[str, str], now_ms: int, channel: str | None = None
    ) -> tuple[bool, dict[str, str]]:
        """Publish input requests; returns (cancel requested, answers already stored by key).

        Tried again for up to two minutes while Redis is unreachable (restarting, failing over).
        """
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.events(channel or task_id)]
        args: list[str | int] = [now_ms, *_pairs(requests)]
        # Posting twice is harmless; a job that cannot ask would fail instead of waiting out a failover.
        reply = while_unreachable(
            task_id,
            "as the job asks",
            lambda: self._replicated("the question", lambda pipe: queue_script(pipe, self._post, keys, args))[0],
        )
        answers = {k: as_text(v) for k, v in zip(requests, reply[1:], strict=True) if v}
        return bool(reply[0]), answers

    def register_approval(
        self, approval_id: str, task_id: str, wire_key: str, request: str, asked_ms: int, keep_s: int
    ) -> None:
        """Index an approval for its page (`Keys.approval`, `Keys.approvals`), for `keep_s` seconds at most.

        The request is kept beside it for the page to show once it is decided or withdrawn (the record
        holds only open requests); the record, not this copy, is what a decision is checked against.
        """
        where = json.dumps({"task": task_id, "key": wire_key, "request": json.loads(request)})

        def build(pipe: Any) -> None:
            pipe.set(self.keys.approval(approval_id), where, ex=keep_s)
            pipe.zadd(self.keys.approvals(), {approval_id: asked_ms})

        while_unreachable(task_id, "as the job asks for approval", lambda: self._replicated("the approval", build))

    def park(self, task_id: str, wire_keys: list[str], until_ms: int, resume: str) -> ParkOutcome:
        """Park the job at its open question (the PARK script): 'parked', 'answered' or 'cancel'.

        `until_ms`: when the question times out; `resume`: the signature that runs the job again.
        Tried again for up to two minutes while Redis is unreachable, as the question was posted.
        """
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.bell(task_id)]
        lifetime = self.lifetimes.live_s + max(until_ms - now_ms(), 0) // 1000
        args: list[str | int] = [until_ms, resume, lifetime, *wire_keys]

        def build(pipe: Any) -> None:
            pipe.zadd(self.keys.live(), {task_id: until_ms})  # before the script: see Keys.live
            pipe.zadd(self.keys.parked(), {task_id: now_ms()})  # the index: taken out below if it did not park
            queue_script(pipe, self._park, keys, args)

        reply = while_unreachable(task_id, "as the job parks", lambda: self._replicated("the park", build)[2])
        outcome = cast(ParkOutcome, as_text(reply))
        if outcome != "parked":
            self.redis.zrem(self.keys.parked(), task_id)
        return outcome

    def memo(self, task_id: str, key: str) -> str | None:
        """The value `JobContext.once` stored under `key` for this task (JSON), or None.

        Tried again for up to two minutes while Redis is unreachable (restarting), rather than failing the job.
        """
        name = self.keys.answers(task_id)
        value = while_unreachable(
            task_id, "as the job looks for a once() value", lambda: self.redis.hget(name, MEMO_PREFIX + key)
        )
        return None if value is None else as_text(value)

    def remember(self, task_id: str, key: str, value: str) -> str:
        """Store `once`'s value under `key` unless one is stored (the first wins); returns the stored one.

        Kept with the answers, which live as long as the record (the job's end expires them with it).
        Tried again for up to two minutes while Redis is unreachable, as the job's outcome is (the work
        is done; a second try of a write that went through reads the stored value back).
        """
        name, field = self.keys.answers(task_id), MEMO_PREFIX + key

        def build(pipe: Any) -> None:
            pipe.hsetnx(name, field, value)
            pipe.expire(name, self.lifetimes.live_s)
            pipe.hget(name, field)

        return as_text(
            while_unreachable(
                task_id, "as the job stores a once() value", lambda: self._replicated("the memo", build)[2]
            )
        )

    def job_ended(
        self,
        task_id: str,
        *,
        asked: bool,
        outcome: Mapping[str, Any] | None = None,
        retry_s: float = OUTCOME_RETRY_S,
        channel: str | None = None,
        ended: EndedEntry | None = None,
    ) -> None:
        """Store the job's `outcome` (unless one is stored already) and let the record live for the TTL.

        One round trip, tried again for up to `retry_s` while Redis is unreachable: an outcome lost
        to a Redis restart would leave the task to be reported lost. Storing it twice is harmless.
        `outcome` is None when the job ends without one of its own (a retry, or a redelivery to
        come); `asked`: the task owns answers and a bell to expire too. `ended`: the ending's entry
        in the ended stream, added if this call stores the outcome (not on a cluster).
        """
        end = partial(self._end, task_id, asked, outcome, channel or task_id, ended)
        while_unreachable(task_id, "while storing how the job ended", end, retry_s)

    def _end(
        self, task_id: str, asked: bool, outcome: Mapping[str, Any] | None, channel: str, ended: EndedEntry | None
    ) -> None:
        keys = [self.keys.task(task_id), self.keys.events(channel)]
        if asked:
            keys += [self.keys.answers(task_id), self.keys.bell(task_id)]
        encoded = "" if outcome is None else json.dumps(outcome, default=str)
        ttl_s = self.lifetimes.ttl_s
        args: list[Any] = [encoded, "" if ttl_s is None else ttl_s]
        if ended is not None and self.streams:
            keys.append(self.keys.ended())
            args += ["1", STREAM_MAXLEN, *ended.to_args()]

        def build(pipe: Any) -> None:
            queue_script(pipe, self._job_end, keys, args)
            pipe.zrem(self.keys.live(), task_id)  # after the script: an entry left by a lost worker is dropped later

        self._replicated("the outcome", build)

    def _replicated(self, what: str, build: Callable[[Any], object]) -> list[Any]:
        """The pipeline of `build`; with `Durability.min_replicas`, and a WAIT for the replicas after it.

        Raises:
            NotReplicated: too few replicas confirmed it (the sentinels were asked for the primary again).
        """
        if not self.durability.min_replicas:
            return self._pipelined(build)

        def with_wait(pipe: Any) -> None:
            build(pipe)
            queue_wait(pipe, self.durability)

        *replies, confirmed = self._pipelined(with_wait)
        try:
            check_replicas(what, confirmed, self.durability)
        except NotReplicated:
            rediscover_primary(self.redis)  # this connection may be on a primary that Sentinel replaced
            raise
        return replies
