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
task `taken` just before that ack (with a Redis broker, a moment after it unless the job started)
and beats the mark until the job starts (its heartbeat counts then) or ends; a worker that dies in
between leaves the mark to run out, and servers end the task `failed` (`mcp_celery.core.status`).

The job's start reaches its task's listeners from here too, a moment late (`ANNOUNCE_AFTER_S`):
JOB_START has shown the job running in its record already (`tasks/get` reads it at once), and a job
that ends within the moment is heard of by its outcome alone, one PUBLISH fewer, and one wake-up
fewer for every server waiting on the task (a synchronous `tools/call` reads the task at each).

With each beat, a job heartbeat also says what its process runs (`WorkerPresence`: each job's task,
tool, start, and since when it waits for input), in the same round trip, idle or not, for the
deployment's figures (`mcp_celery.store.deployment`, `mcp-celery top`): nothing per job.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from typing import Self

from redis.exceptions import RedisError

from mcp_celery.protocol import now_ms
from mcp_celery.store.deployment import WorkerJob, WorkerPresence
from mcp_celery.store.replication import NotReplicated
from mcp_celery.store.sync import SyncStore

__all__ = ["Heartbeat", "TakenBeat"]

logger = logging.getLogger(__name__)

#: How long a `taken` mark may wait for the job to start first (at most a sixth of the heartbeat timeout).
MARK_AFTER_S = 1.0
#: How long a job runs before its task's listeners hear that it started (`Heartbeat.add`).
ANNOUNCE_AFTER_S = 0.25


class Heartbeat:
    """Beats for the jobs running in this process; `running(task_id)` brackets each job."""

    _instances: dict[tuple[type[Heartbeat], int, int], Heartbeat] = {}
    _lock = threading.Lock()
    thread_name = "mcp-celery-heartbeat"
    #: Whether the beats say what the process runs (the job heartbeat's; not the main process's marks).
    presents = True

    def __init__(self, store: SyncStore, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        #: The Celery worker's name (celery@host), from the first job's request.
        self.node = ""
        self._jobs: set[str] = set()
        self._shown: dict[str, WorkerJob] = {}
        self._announce: dict[str, tuple[str, float]] = {}  # task id -> (its event channel, when: monotonic)
        self._jobs_lock = threading.Lock()
        self._next_beat = time.monotonic() + self.timeout_s / 3
        self._wake_at = self._next_beat  # when the thread wakes next, unless nudged
        self._nudge = threading.Event()
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

    @property
    def period_ms(self) -> int:
        """How long one beat keeps a job alive."""
        return int(self.timeout_s * 1000)

    def deadline_ms(self) -> int:
        return now_ms() + self.period_ms

    def add(self, task_id: str, tool: str = "", started_ms: int = 0, announce: str | None = None) -> None:
        """Beat for the job from now on; `announce`: the channel that hears of its start `ANNOUNCE_AFTER_S` later."""
        with self._jobs_lock:
            self._jobs.add(task_id)
            self._shown[task_id] = WorkerJob(task_id, tool, started_ms)
            if announce is not None:
                self._announce[task_id] = (announce, time.monotonic() + ANNOUNCE_AFTER_S)
        if announce is not None:
            self._soon(time.monotonic() + ANNOUNCE_AFTER_S)

    def _soon(self, at: float) -> None:
        """Wake the thread by `at` (it sleeps until its next beat, or the next due work it knew of)."""
        with self._jobs_lock:
            nudge = at < self._wake_at
        if nudge:
            self._nudge.set()

    def waiting(self, task_id: str, since_ms: int | None) -> None:
        """The job waits for input since `since_ms` (None: no more); the next beat says so."""
        with self._jobs_lock:
            job = self._shown.get(task_id)
            if job is not None:
                self._shown[task_id] = WorkerJob(job.task_id, job.tool, job.started_ms, since_ms)

    def discard(self, task_id: str) -> None:
        with self._jobs_lock:
            self._jobs.discard(task_id)
            self._shown.pop(task_id, None)
            self._announce.pop(task_id, None)  # ended within the moment: its outcome tells its listeners

    def _run(self) -> None:
        while True:
            with self._jobs_lock:
                self._wake_at = min(self._next_beat, self._next_due())
            self._nudge.wait(max(self._wake_at - time.monotonic(), 0.0))
            self._nudge.clear()
            self._tick()

    def _next_due(self) -> float:
        """When the earliest work other than the beat is due (monotonic; inf: none). Under the lock."""
        return min((at for _, at in self._announce.values()), default=math.inf)

    def _tick(self) -> None:
        self._announce_due()
        if time.monotonic() >= self._next_beat:
            self._next_beat = time.monotonic() + self.timeout_s / 3
            self._beat_all()

    def _announce_due(self) -> None:
        now = time.monotonic()
        with self._jobs_lock:
            due = [task_id for task_id, (_, at) in self._announce.items() if at <= now]
            channels = [self._announce.pop(task_id)[0] for task_id in due]
        if not channels:
            return
        try:
            self.store.announce_started(channels)
        except (RedisError, OSError):
            # Best effort, as a progress is: the record shows the job running, and its next event wakes listeners.
            logger.warning("could not tell the listeners of %d task(s) that their job started", len(channels))

    def _beat_all(self) -> None:
        with self._jobs_lock:
            jobs = sorted(self._jobs)
        if not jobs and not self.presents:
            return
        try:
            self._beat(jobs, self.deadline_ms())
        except NotReplicated as exc:
            # Written, but maybe on a primary that Sentinel replaced (its look-up is done now): beat
            # again at once, so the new primary hears of the jobs before their deadline runs out there.
            logger.warning("heartbeat for %d job(s): %s; beating again", len(jobs), exc)
            with contextlib.suppress(RedisError, OSError, NotReplicated):
                self._beat(jobs, self.deadline_ms())
        except (RedisError, OSError):
            # Redis may be restarting; the next beat tries again, and a deadline missed
            # meanwhile is what a lost worker looks like, so keep the period short.
            logger.warning("heartbeat for %d job(s) failed", len(jobs), exc_info=True)

    def _beat(self, jobs: list[str], deadline_ms: int) -> None:
        with self._jobs_lock:
            shown = tuple(self._shown.values())
        presence = WorkerPresence(self.worker_id, self.node, deadline_ms - self.period_ms, shown)
        self.store.beat(jobs, deadline_ms, presence)


class TakenBeat(Heartbeat):
    """Beats the `taken` mark of the jobs whose message this process acked early, until each starts.

    With a broker whose queues servers look into (Redis), a mark may wait (`mark_soon`): a job that
    starts within `mark_after_s` (nearly every one) then costs no command at all, and one whose
    worker dies before the mark is found by the servers' own looks for its message, which call it
    lost only when it is nowhere twice, a reaper period (a third of the heartbeat timeout) apart:
    longer than the wait, so the mark or the job's start comes between the two.
    """

    thread_name = "mcp-celery-taken-beat"
    presents = False

    def __init__(self, store: SyncStore, timeout_s: float) -> None:
        self._due: dict[str, float] = {}  # task id -> when to mark it (monotonic), if it has not started
        self._failed: set[str] = set()  # due tasks whose mark failed once (said once, then retried quietly)
        self.mark_after_s = min(MARK_AFTER_S, timeout_s / 6)
        super().__init__(store, timeout_s)

    def mark_soon(self, task_id: str) -> None:
        """Mark the task `taken` in `mark_after_s` unless its request ends first (`discard`)."""
        at = time.monotonic() + self.mark_after_s
        with self._jobs_lock:
            self._due[task_id] = at
        self._soon(at)

    def discard(self, task_id: str) -> None:
        with self._jobs_lock:
            self._due.pop(task_id, None)
            self._failed.discard(task_id)
        super().discard(task_id)

    def _next_due(self) -> float:
        return min(super()._next_due(), min(self._due.values(), default=math.inf))

    def _tick(self) -> None:
        self._mark_due()
        super()._tick()

    def _mark_due(self) -> None:
        now = time.monotonic()
        with self._jobs_lock:
            due = [task_id for task_id, at in self._due.items() if at <= now]
        for task_id in due:
            try:
                marked = self.store.mark_taken(task_id, self.deadline_ms())
            except (RedisError, OSError):
                # Tried again next tick while the job has not started: its message is acked, so servers
                # find it nowhere, and an unmarked task would be called lost with its worker alive.
                with self._jobs_lock:
                    if self._due.pop(task_id, None) is not None:
                        self._due[task_id] = time.monotonic() + self.mark_after_s / 2
                        first = task_id not in self._failed
                        self._failed.add(task_id)
                if first:
                    logger.warning("task %s: could not mark its message taken; trying again", task_id, exc_info=True)
                continue
            with self._jobs_lock:
                still_due = self._due.pop(task_id, None) is not None  # not if its request ended meanwhile
                self._failed.discard(task_id)
            if marked and still_due:
                self.add(task_id)

    def _beat(self, jobs: list[str], deadline_ms: int) -> None:
        # A job that started (its own heartbeat beats now) or ended needs no more beats.
        for task_id in self.store.beat_taken(jobs, deadline_ms):
            self.discard(task_id)
