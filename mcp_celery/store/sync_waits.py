"""The worker's doorbell loops, a part of `SyncStore`: a job waiting for answers, or sleeping.

Tier 1. A waiting job blocks on one BLPOP of its task's bell, which rings on every answer and on
cancel, so a waiting job costs no polling; the answers and the cancel flag are durable in the
record, so a Redis that is away for a moment is waited out, not given up on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.retry import MIN_BLOCK_S, NOT_YET, OUTCOME_RETRY_S, RECONNECT_PAUSE_S
from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, Keys, as_text

__all__ = ["AnswerWait", "DoorbellWaits"]

logger = logging.getLogger("mcp_celery.store.sync")


@dataclass(frozen=True)
class AnswerWait:
    """How a wait for answers ended: every answer in, a cancel, or the timeout with some missing."""

    answers: dict[str, str] = field(default_factory=lambda: {})
    cancelled: bool = False
    missing: tuple[str, ...] = ()


class DoorbellWaits:
    """The waiting methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys

    def _replicated(self, what: str, build: Callable[[Any], object]) -> list[Any]:
        raise NotImplementedError

    def cancel_requested(self, task_id: str) -> bool:
        """Whether the client cancelled; False while Redis is unreachable (the flag is durable, seen later)."""
        try:
            return bool(self.redis.hexists(self.keys.task(task_id), FIELD.CANCEL))
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("task %s: Redis unreachable; cancel checked again at the next checkpoint", task_id)
            return False

    def wait_for_answers(
        self, task_id: str, wire_keys: list[str], timeout_s: float, *, withdraw: bool = True
    ) -> AnswerWait:
        """Block until every key is answered, the task is cancelled, or `timeout_s` passes.

        Without `withdraw` (the job parks next) a timeout only says which keys are missing. With it,
        on timeout the unanswered requests are withdrawn from the record; an answer acked to
        the client in the instant before that is still kept. The timeout stands only once Redis took
        the withdrawal (and, with `Durability.min_replicas`, its replicas did): until then, for up to
        `OUTCOME_RETRY_S` past it, an answer may still have been acknowledged, so the wait goes on.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                rang = self._wait_bell(task_id, deadline - time.monotonic())
                cancel, answers = self._poll_answers(task_id, wire_keys)
                if not cancel and len(answers) < len(wire_keys) and not rang and time.monotonic() >= deadline:
                    if not withdraw:
                        return AnswerWait(answers, missing=tuple(sorted(set(wire_keys) - set(answers))))
                    self._withdraw_inputs(task_id, [k for k in wire_keys if k not in answers])
                    cancel, answers = self._poll_answers(task_id, wire_keys)
                    if not cancel and len(answers) < len(wire_keys):
                        return AnswerWait(answers, missing=tuple(sorted(set(wire_keys) - set(answers))))
            except NOT_YET as exc:
                if time.monotonic() >= deadline + OUTCOME_RETRY_S:
                    raise
                # Redis is restarting or failing over: the answers are durable there, so wait for it.
                logger.warning("task %s: waiting for answers: %s; retrying", task_id, exc or type(exc).__name__)
                left = deadline - time.monotonic()
                time.sleep(min(RECONNECT_PAUSE_S, left) if left > 0 else RECONNECT_PAUSE_S)
                continue
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

    def _poll_answers(self, task_id: str, wire_keys: list[str]) -> tuple[bool, dict[str, str]]:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hexists(self.keys.task(task_id), FIELD.CANCEL)
            pipe.hmget(self.keys.answers(task_id), wire_keys)
            cancel, values = pipe.execute()
        return bool(cancel), {k: as_text(v) for k, v in zip(wire_keys, values, strict=True) if v}

    def _withdraw_inputs(self, task_id: str, wire_keys: list[str]) -> None:
        fields = [INPUT_FIELD_PREFIX + k for k in wire_keys]
        self._replicated("giving up on the question", lambda pipe: pipe.hdel(self.keys.task(task_id), *fields))

    def _ring(self, task_id: str) -> None:
        """Pass a wake-up on: BLPOP wakes one waiter per ring, and a duplicate delivery may be waiting too.

        Best effort: the job has what it waited for, and a duplicate finds the answers when its own wait ends.
        """
        try:
            self.redis.lpush(self.keys.bell(task_id), "relay")
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("task %s: Redis unreachable; a duplicate delivery waiting too is not woken", task_id)

    def _wait_bell(self, task_id: str, timeout_s: float) -> bool:
        """Block until the bell rings (answer or cancel) or the timeout passes; True if it rang."""
        if timeout_s < MIN_BLOCK_S:
            # Redis turns a BLPOP timeout into whole milliseconds by truncation, and a timeout that
            # truncates to 0 blocks for ever (seen with 0.001 s on Redis 6.2): never send one that small.
            time.sleep(max(timeout_s, 0.0))
            return False
        return self.redis.blpop([self.keys.bell(task_id)], timeout=round(timeout_s, 3)) is not None
