"""The heartbeat of running jobs: how servers learn that a worker died with a job on it.

Worker tier. One daemon thread per process (started on the first job the process runs, so it
lives in each prefork child, after the fork) beats for every job running in that process:
three times per `worker_lost_timeout_s`, one round trip for all of them, each beat pushing the
job's deadline (`alive` in its record, and its score in the `live` set) one period ahead. If the
process dies (SIGKILL, the OOM killer, a lost machine), the beats stop and any server turns the
task `failed` once the deadline passes. A thread rather than the job itself beats, so a job
that computes for an hour without a checkpoint is still alive.

Before a job starts there is a moment no job heartbeat covers: the worker's main process acks an
at-most-once job's message as soon as a pool process takes it (Celery's early ack), and the job
beats only once it has started. `TakenBeat`, in the main process, covers it: the worker marks the
task `taken` just before that ack and beats the mark until the job starts (JOB_START removes it)
or ends; a worker that dies in between leaves the mark to run out, and servers end the task
`failed` (`mcp_celery.status`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Self

from redis.exceptions import RedisError

from mcp_celery.protocol import now_ms
from mcp_celery.store.sync import SyncStore

__all__ = ["Heartbeat", "TakenBeat"]

logger = logging.getLogger(__name__)


class Heartbeat:
    """Beats for the jobs running in this process; `running(task_id)` brackets each job."""

    _instances: dict[tuple[type[Heartbeat], int, int], Heartbeat] = {}
    _lock = threading.Lock()
    thread_name = "mcp-celery-heartbeat"

    def __init__(self, store: SyncStore, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._jobs: set[str] = set()
        self._jobs_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    @classmethod
    def of_process(cls, store: SyncStore, timeout_s: float) -> Self:
        """This process's heartbeat for `store` (a forked child gets its own: threads do not survive a fork)."""
        key = (cls, os.getpid(), id(store))
        with cls._lock:
            found = cls._instances.get(key)
            if found is None:
                found = cls._instances[key] = cls(store, timeout_s)
            assert isinstance(found, cls)
            return found

    def deadline_ms(self) -> int:
        return now_ms() + int(self.timeout_s * 1000)

    def add(self, task_id: str) -> None:
        with self._jobs_lock:
            self._jobs.add(task_id)

    def discard(self, task_id: str) -> None:
        with self._jobs_lock:
            self._jobs.discard(task_id)

    def _run(self) -> None:
        interval = self.timeout_s / 3
        while not self._wake.wait(interval):
            with self._jobs_lock:
                jobs = sorted(self._jobs)
            if not jobs:
                continue
            try:
                self._beat(jobs, self.deadline_ms())
            except (RedisError, OSError):
                # Redis may be restarting; the next beat tries again, and a deadline missed
                # meanwhile is what a lost worker looks like, so keep the period short.
                logger.warning("heartbeat for %d job(s) failed", len(jobs), exc_info=True)

    def _beat(self, jobs: list[str], deadline_ms: int) -> None:
        self.store.beat(jobs, deadline_ms)


class TakenBeat(Heartbeat):
    """Beats the `taken` mark of the jobs whose message this process acked early, until each starts."""

    thread_name = "mcp-celery-taken-beat"

    def _beat(self, jobs: list[str], deadline_ms: int) -> None:
        # A job that started (its own heartbeat beats now) or ended needs no more beats.
        for task_id in self.store.beat_taken(jobs, deadline_ms):
            self.discard(task_id)
