"""The heartbeat of running jobs: how servers learn that a worker died with a job on it.

Worker tier. One daemon thread per process (started on the first job the process runs, so it
lives in each prefork child, after the fork) beats for every job running in that process:
three times per `worker_lost_timeout_s`, one round trip for all of them, each beat pushing the
job's deadline (`alive` in its record, and its score in the `live` set) one period ahead. If the
process dies (SIGKILL, the OOM killer, a lost machine), the beats stop and any server turns the
task `failed` once the deadline passes. A thread rather than the job itself beats, so a job
that computes for an hour without a checkpoint is still alive.
"""

from __future__ import annotations

import logging
import os
import threading

from redis.exceptions import RedisError

from mcp_celery.protocol import now_ms
from mcp_celery.store.sync import SyncStore

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)


class Heartbeat:
    """Beats for the jobs running in this process; `running(task_id)` brackets each job."""

    _instances: dict[tuple[int, int], Heartbeat] = {}
    _lock = threading.Lock()

    def __init__(self, store: SyncStore, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._jobs: set[str] = set()
        self._jobs_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mcp-celery-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def of_process(cls, store: SyncStore, timeout_s: float) -> Heartbeat:
        """This process's heartbeat for `store` (a forked child gets its own: threads do not survive a fork)."""
        key = (os.getpid(), id(store))
        with cls._lock:
            found = cls._instances.get(key)
            if found is None:
                found = cls._instances[key] = cls(store, timeout_s)
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
                self.store.beat(jobs, self.deadline_ms())
            except (RedisError, OSError):
                # Redis may be restarting; the next beat tries again, and a deadline missed
                # meanwhile is what a lost worker looks like, so keep the period short.
                logger.warning("heartbeat for %d job(s) failed", len(jobs), exc_info=True)
