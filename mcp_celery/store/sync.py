"""The worker's shell over the store: synchronous redis-py, used from inside running jobs.

Holds the doorbell loops too: a job waiting for answers or sleeping blocks on one BLPOP of its
bell, which rings on every answer and on cancel, so a waiting job costs no polling.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from mcp_celery.protocol import now_ms
from mcp_celery.store import scripts
from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, JOB_FIELDS, Keys, Lifetimes, TaskRecord, as_text

__all__ = ["MIN_BLOCK_S", "AnswerWait", "SyncStore"]

#: The shortest wait sent to Redis as a blocking command; shorter ones are slept here.
MIN_BLOCK_S = 0.01
#: How long a waiting job pauses before trying an unreachable Redis again.
RECONNECT_PAUSE_S = 0.5
#: How long a finished job keeps trying to store its outcome while Redis is unreachable (restarting).
OUTCOME_RETRY_S = 120.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnswerWait:
    """How a wait for answers ended: every answer in, a cancel, or the timeout with some missing."""

    answers: dict[str, str] = field(default_factory=lambda: {})
    cancelled: bool = False
    missing: tuple[str, ...] = ()


def _pairs(items: Mapping[str, str]) -> list[str]:
    return [part for pair in items.items() for part in pair]


class SyncStore:
    """The worker's view of the store. Its client must have no socket timeout (it blocks on BLPOP)."""

    def __init__(self, client: redis.Redis, keys: Keys, lifetimes: Lifetimes) -> None:
        self.redis = client
        self.keys = keys
        self.lifetimes = lifetimes
        self._post = client.register_script(scripts.POST_INPUTS)
        self._beat = client.register_script(scripts.BEAT)
        self._job_start = client.register_script(scripts.JOB_START)
        self._progress = client.register_script(scripts.PROGRESS)
        self._outcome = client.register_script(scripts.OUTCOME)
        self._lost = client.register_script(scripts.LOST)
        self._taken = client.register_script(scripts.TAKEN)

    def job_started(
        self, task_id: str, alive_until_ms: int, live_s: int | None = None, *, may_run_again: bool = False
    ) -> TaskRecord | None:
        """The record a starting job needs, or None when the job was not started through MCP.

        Also restarts the record's lifetime (`live_s`, default TTL plus the longest job), so that a
        job that waited long in the queue still has its whole run ahead of it (a running task never
        expires), beats once and shows the job running. A record whose `alive_until_ms` is set comes
        from an earlier delivery that started; unless `may_run_again`, nothing is written then.
        """
        keys = [self.keys.task(task_id), self.keys.live(), self.keys.events(task_id)]
        lifetime = self.lifetimes.live_s if live_s is None else live_s
        started = json.dumps({"status": "STARTED"})
        again = "1" if may_run_again else ""
        args: list[str | int] = [lifetime, alive_until_ms, task_id, now_ms(), started, again, *JOB_FIELDS]
        values = self._job_start(keys=keys, args=args)
        fields = {name: as_text(v) for name, v in zip(JOB_FIELDS, values, strict=True) if v is not None}
        return TaskRecord.from_job_fields(task_id, fields) if FIELD.TOOL in fields else None

    def count_run(self, task_id: str) -> int:
        """Count one more start of a job that runs again when its worker is lost; returns the count."""
        return int(self.redis.hincrby(self.keys.task(task_id), FIELD.RUNS, 1))

    def beat(self, task_ids: list[str], alive_until_ms: int) -> None:
        """Heartbeat of running jobs: each stays `alive` until `alive_until_ms` (one round trip for all)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                self._beat(
                    keys=[self.keys.task(task_id), self.keys.live()], args=[alive_until_ms, task_id], client=pipe
                )
            pipe.execute()

    def mark_taken(self, task_id: str, taken_until_ms: int) -> bool:
        """A worker is about to ack the job's message early: watch the task until its job starts.

        False (nothing written): not an MCP task, or its job has started or ended already.
        """
        keys = [self.keys.task(task_id), self.keys.live()]
        return bool(self._taken(keys=keys, args=[taken_until_ms, task_id, "1"]))

    def beat_taken(self, task_ids: list[str], taken_until_ms: int) -> list[str]:
        """Push the `taken` deadline of these tasks on (one round trip); returns those no longer to beat for."""
        with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                keys = [self.keys.task(task_id), self.keys.live()]
                self._taken(keys=keys, args=[taken_until_ms, task_id, ""], client=pipe)
            written = pipe.execute()
        return [task_id for task_id, ok in zip(task_ids, written, strict=True) if not ok]

    def progress(self, task_id: str, meta: Mapping[str, Any]) -> None:
        """Show the job's progress (`{"status": ..., "result": ...}`, as Celery's result meta).

        Best effort: while Redis is unreachable (restarting) the job goes on; its next progress shows.
        """
        keys = [self.keys.task(task_id), self.keys.events(task_id)]
        try:
            self._progress(keys=keys, args=[json.dumps(meta, default=str), now_ms()])
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("task %s: Redis unreachable; this progress is not shown", task_id)

    def job_interrupted(self, task_id: str, at_ms: int) -> None:
        """The job's process is being stopped mid-job: its heartbeat ends now, not a period later.

        Listeners hear of it at once (the ping makes servers read the task, which is then lost);
        an outcome stored meanwhile still wins, since a finished job is never lost.
        """
        with self.redis.pipeline(transaction=False) as pipe:
            self._beat(keys=[self.keys.task(task_id), self.keys.live()], args=[at_ms - 1, task_id], client=pipe)
            pipe.publish(self.keys.events(task_id), "lost")
            pipe.execute()

    def note_lost_reason(self, task_ids: list[str], reason: str) -> None:
        """Say why these jobs' heartbeats may stop (a worker shutting down); no effect on a job that finishes."""
        with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                self._lost(keys=[self.keys.task(task_id)], args=[reason], client=pipe)
            pipe.execute()

    def cancel_requested(self, task_id: str) -> bool:
        """Whether the client cancelled; False while Redis is unreachable (the flag is durable, seen later)."""
        try:
            return bool(self.redis.hexists(self.keys.task(task_id), FIELD.CANCEL))
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("task %s: Redis unreachable; cancel checked again at the next checkpoint", task_id)
            return False

    def post_inputs(self, task_id: str, requests: Mapping[str, str], now_ms: int) -> tuple[bool, dict[str, str]]:
        """Publish input requests; returns (cancel requested, answers already stored by key)."""
        keys = [self.keys.task(task_id), self.keys.answers(task_id), self.keys.events(task_id)]
        reply = self._post(keys=keys, args=[now_ms, *_pairs(requests)])
        answers = {k: as_text(v) for k, v in zip(requests, reply[1:], strict=True) if v}
        return bool(reply[0]), answers

    def wait_for_answers(self, task_id: str, wire_keys: list[str], timeout_s: float) -> AnswerWait:
        """Block until every key is answered, the task is cancelled, or `timeout_s` passes.

        On timeout the unanswered requests are withdrawn from the record; an answer acked to
        the client in the instant before that is still kept.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                rang = self._wait_bell(task_id, deadline - time.monotonic())
                cancel, answers = self._poll_answers(task_id, wire_keys)
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() >= deadline:
                    raise
                # Redis is restarting: the answers are durable there, so wait for it, not give up.
                logger.warning("task %s: Redis unreachable while waiting for answers; retrying", task_id)
                time.sleep(min(RECONNECT_PAUSE_S, max(deadline - time.monotonic(), 0.0)))
                continue
            if not cancel and len(answers) < len(wire_keys) and not rang and time.monotonic() >= deadline:
                self._withdraw_inputs(task_id, [k for k in wire_keys if k not in answers])
                cancel, answers = self._poll_answers(task_id, wire_keys)
                if not cancel and len(answers) < len(wire_keys):
                    return AnswerWait(answers, missing=tuple(sorted(set(wire_keys) - set(answers))))
            if cancel or len(answers) == len(wire_keys):
                # Another execution of this task (a duplicate delivery) may be blocked on the bell too.
                self._ring(task_id)
                return AnswerWait(answers, cancelled=cancel)

    def sleep_unless_cancelled(self, task_id: str, seconds: float) -> bool:
        """Sleep `seconds`, waking at once on cancel; True when the task was cancelled."""
        deadline = time.monotonic() + seconds
        if self.cancel_requested(task_id):
            return True
        while (left := deadline - time.monotonic()) > 0:
            try:
                if self._wait_bell(task_id, left) and self.cancel_requested(task_id):
                    self._ring(task_id)
                    return True
            except (redis.ConnectionError, redis.TimeoutError):
                # Redis is restarting: a sleep goes on; the cancel flag is durable and read again.
                time.sleep(min(RECONNECT_PAUSE_S, left))
        return False

    def job_ended(
        self, task_id: str, *, asked: bool, outcome: Mapping[str, Any] | None = None, retry_s: float = OUTCOME_RETRY_S
    ) -> None:
        """Store the job's `outcome` (unless one is stored already) and let the record live for the TTL.

        One round trip, tried again for up to `retry_s` while Redis is unreachable: an outcome lost
        to a Redis restart would leave the task to be reported lost. Storing it twice is harmless.
        `outcome` is None when the job ends without one of its own (a retry, or a redelivery to
        come); `asked`: the task owns answers and a bell to expire too.
        """
        deadline = time.monotonic() + retry_s
        while True:
            try:
                self._end(task_id, asked, outcome)
                return
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() >= deadline:
                    raise
                logger.warning("task %s: Redis unreachable while storing how the job ended; retrying", task_id)
                time.sleep(RECONNECT_PAUSE_S)

    def _end(self, task_id: str, asked: bool, outcome: Mapping[str, Any] | None) -> None:
        task = self.keys.task(task_id)
        keys = [task] + ([self.keys.answers(task_id), self.keys.bell(task_id)] if asked else [])
        ttl_s = self.lifetimes.ttl_s
        with self.redis.pipeline(transaction=False) as pipe:
            if outcome is not None:
                encoded = json.dumps(outcome, default=str)
                self._outcome(keys=[task, self.keys.events(task_id)], args=[encoded], client=pipe)
            for key in keys:
                if ttl_s is None:
                    pipe.persist(key)
                else:
                    pipe.expire(key, ttl_s)
            pipe.zrem(self.keys.live(), task_id)
            pipe.execute()

    def _poll_answers(self, task_id: str, wire_keys: list[str]) -> tuple[bool, dict[str, str]]:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hexists(self.keys.task(task_id), FIELD.CANCEL)
            pipe.hmget(self.keys.answers(task_id), wire_keys)
            cancel, values = pipe.execute()
        return bool(cancel), {k: as_text(v) for k, v in zip(wire_keys, values, strict=True) if v}

    def _withdraw_inputs(self, task_id: str, wire_keys: list[str]) -> None:
        self.redis.hdel(self.keys.task(task_id), *[INPUT_FIELD_PREFIX + k for k in wire_keys])

    def _ring(self, task_id: str) -> None:
        """Pass a wake-up on: BLPOP wakes one waiter per ring, and a duplicate delivery may be waiting too."""
        self.redis.lpush(self.keys.bell(task_id), "relay")

    def _wait_bell(self, task_id: str, timeout_s: float) -> bool:
        """Block until the bell rings (answer or cancel) or the timeout passes; True if it rang."""
        if timeout_s < MIN_BLOCK_S:
            # Redis turns a BLPOP timeout into whole milliseconds by truncation, and a timeout that
            # truncates to 0 blocks for ever (seen with 0.001 s on Redis 6.2): never send one that small.
            time.sleep(max(timeout_s, 0.0))
            return False
        return self.redis.blpop([self.keys.bell(task_id)], timeout=round(timeout_s, 3)) is not None
