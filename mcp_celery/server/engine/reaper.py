"""The reaper: each server process looks after the tasks whose job owes a sign of life.

Server tier. The `live` sorted set holds every task some worker should be making progress on,
scored by when it must have shown it: a running job's heartbeat deadline, or, for a task whose
job has not started, the time to look for its message (`queue_check_s` after creation; only
with a Redis broker, whose queues can be looked into). Every period, each server takes the
overdue ones; none of them is special, and what they decide is a check-and-set in Redis
(FREEZE, the broker's REQUEUE), so two servers never decide twice.

* A started job whose heartbeat ran out: reading the task freezes it `failed` (at-most-once).
  A `retry_on_worker_loss` tool reads `working` instead ("waiting to run the job again"), and
  its message is looked for: still in kombu's unacked hash from the lost run (the whole worker
  died, and kombu would hand it out again only after the visibility timeout, hours), it is
  moved back to its queue now. Put back and then taken by a worker lost before the new run
  started, it is moved back again, as an unstarted job's message is (below).
* A job whose message a worker took (acked early, at-most-once) but which has not started: the
  worker's main process marks the task `taken` just before the ack and beats the mark until the
  job starts (`mcp_celery.worker.taken`; from then on the heartbeat counts, and the mark is ignored),
  so it is overdue only if that worker was lost; reading
  the task freezes it `failed` ("the worker that took the job's message was lost before the job
  started"), with any broker. A job refused at its start once the task is frozen never runs.
* A call the approval policy holds (`gate`) waits parked before its first run: its approval's
  window is its one deadline, as a parked question's is; run out, the task completes "not run".
* A job that a worker refused, its task being in another store than the worker's: Celery's result
  backend holds the refusal (`refused`), looked for first, from `FIRST_LOOK_S` after the task's
  creation on, with any broker; the task ends `failed` with the worker's words.
* A job that has not started otherwise: its message is looked for in its queue and the unacked hash.
  Found, it is looked at again `queue_check_s` later (a task queued behind busy workers is
  never failed); found in the unacked hash, delivered longer than the heartbeat timeout ago
  (a dead worker held it unstarted), it is moved back to its queue, at-most-once or not, since
  only one delivery can ever start a job (JOB_START refuses a second). Found nowhere twice, a
  period apart (a message in flight between BRPOP and kombu's unacked copy is seen again by
  then; one acked early has started or been marked `taken` by then, since with a Redis broker
  the worker marks it only if it has not started a moment after the ack), the task ends
  `failed`: no worker has its message, none ever will.

With RabbitMQ there is no queue to look into, and no need: the broker redelivers a closed
channel's unacked messages by itself, and an early-acked one is marked `taken` as above. Left
unwatched there: a message lost by the broker itself, and the instant between the `taken` mark
and the ack in the worker's main process (a worker dying then has its message redelivered; if no
worker takes it within the heartbeat timeout, the task ends `failed` and the job is refused).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from redis.exceptions import RedisError

from mcp_celery import logs
from mcp_celery.core.binding import queue_of
from mcp_celery.core.status import PARKED_TIMEOUT, Found, TaskView, ended_without_job, lost_entry
from mcp_celery.protocol import INTERNAL_ERROR, now_ms
from mcp_celery.server.engine.broker import NOWHERE, STALE, RedisBroker
from mcp_celery.server.engine.gate import PolicyGate, timed_out
from mcp_celery.server.engine.refused import refusals
from mcp_celery.settings import Settings
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.schema import TaskRecord

__all__ = ["FIRST_LOOK_S", "LOST_BEFORE_START", "LOST_WITH_WORKER", "SWEEP_S", "Reaper", "TaskReader"]

logger = logging.getLogger(__name__)

LOST_BEFORE_START = "the job's message was lost before any worker started it"
LOST_WITH_WORKER = "the worker running the job was lost, and the job's message with it, so it cannot run again"
#: How soon after its creation an unstarted task is first looked at (a refusal, then its message).
FIRST_LOOK_S = 2.0
#: The longest between two sweeps, whatever the heartbeat period: a refused job's task ends within seconds.
SWEEP_S = 1.0


class TaskReader(Protocol):
    """What the reaper reads through (the task service): a task's view, frozen once ended, and its Celery task."""

    async def read_view(self, task_id: str, *, confirmed: bool = False) -> Found | None: ...

    def celery_task(self, name: str) -> Any: ...

    def redelivered_on_loss(self, name: str) -> bool: ...

    async def resume(self, record: TaskRecord, signature: str) -> None: ...


@dataclass(frozen=True)
class _Sought:
    """A task whose message is to be found: its queue, whether its job had started, and when its
    worker must have taken a message that is to count as lost with it (s; 0: never)."""

    queue: str
    started: bool
    stale_before: float


class Reaper:
    """One server process's sweeps over the overdue tasks."""

    def __init__(self, tasks: TaskReader, store: AsyncStore, settings: Settings, app: Any) -> None:
        self.tasks = tasks
        self.store = store
        self.app = app
        #: A message found nowhere is looked for again this much later before it counts as lost.
        self.period_s = max(settings.worker_lost_timeout_s / 3, 0.2)
        #: How often the overdue tasks are read (one command when none is).
        self.sweep_s = min(self.period_s, SWEEP_S)
        self.lost_ms = int(settings.worker_lost_timeout_s * 1000)
        self.check_ms = int(settings.queue_check_s * 1000)
        self.broker = RedisBroker.of_app(app)
        self._missing: dict[str, int] = {}  # task id -> when its message was first found nowhere (ms)
        self._queues: dict[str, str] = {}  # tool -> the queue its messages go to

    def first_check_ms(self, created_ms: int) -> int:
        """When a new task is first looked at if its job has not started: a refusal, then its message."""
        return created_ms + min(self.check_ms, int(FIRST_LOOK_S * 1000))

    async def run(self) -> None:
        """Sweep every period for as long as the server runs: turn the tasks whose heartbeat ran out `failed`
        (or re-queue them), and so tell their listeners; also end the tasks whose message was lost before a
        job started.

        Every server process does this, none of them special: the read freezes the terminal state
        with a check-and-set, so two replicas reaping the same task agree, and the freeze publishes
        the change. A task read by a client first is frozen by that read just the same.
        """
        while True:
            await anyio.sleep(self.sweep_s)
            try:
                await self.sweep()
            except (RedisError, OSError):
                logger.warning("could not look for lost jobs; trying again in %.1f s", self.sweep_s, exc_info=True)
            except Exception:  # noqa: BLE001 - a surprise in one sweep must not stop the server
                logger.exception("looking for lost jobs failed; trying again in %.1f s", self.sweep_s)

    async def sweep(self) -> None:
        now = now_ms()
        store = self.store
        overdue = await store.overdue(now)
        if not overdue:
            return
        marks = await store.job_marks(overdue)
        done = [task_id for task_id in overdue if task_id not in marks]
        # No job started, no worker took the message, not parked: a worker may have refused it.
        unstarted = [task_id for task_id, m in marks.items() if (m.alive_ms, m.taken_ms, m.parked_ms) == (None,) * 3]
        for task_id, message in (await refusals(self.app, unstarted)).items():
            await self._refused(task_id, message)
            done.append(task_id)
            marks.pop(task_id)
        sought: dict[str, _Sought] = {}
        for task_id, (tool, alive_ms, taken_ms, parked_ms) in marks.items():
            if parked_ms is not None:  # no job runs: the question's timeout is the one deadline
                await self._parked(task_id, parked_ms, now)
                continue
            # The job's heartbeat, or before the job starts the beat of the worker that took its message.
            deadline = alive_ms if alive_ms is not None else taken_ms
            if deadline is not None and deadline > now:
                continue  # beat since the set was read
            if deadline is not None and await self._settled(task_id):
                done.append(task_id)
                continue
            found = self._sought(tool, alive_ms, now)
            if found is None:
                await store.recheck([task_id], now + self.check_ms)
            else:
                sought[task_id] = found
        await store.forget_live(done)
        if sought and self.broker is not None:
            await self._look_for(self.broker, sought, now)
        self._missing = {k: v for k, v in self._missing.items() if now - v < 10 * self.check_ms}

    async def _parked(self, task_id: str, until_ms: int, now: int) -> None:
        """A parked job's question: looked at again when it times out; timed out, the task ends failed."""
        if until_ms > now:
            await self.store.recheck([task_id], until_ms)
            return
        found = await self.tasks.read_view(task_id)
        if found is not None and not found[1].terminal and found[0].parked_until_ms is not None:
            record = found[0]
            if PolicyGate.holds(record):  # a call the approval policy held: "not run: no decision within ..."
                await timed_out(self.store, self.app, record, until_ms)
                return
            fields = logs.task_fields(task_id, record.tool, principal=record.owner, status="failed", event="timeout")
            logger.warning("task %s: %s", task_id, PARKED_TIMEOUT, extra=fields)
            error = {"code": INTERNAL_ERROR, "message": PARKED_TIMEOUT}
            view = TaskView("failed", until_ms, PARKED_TIMEOUT, error=error)
            await self.store.freeze(task_id, view.to_json(), ended=ended_without_job(record, view))
        await self.store.forget_live([task_id])

    async def _refused(self, task_id: str, message: str) -> None:
        """A worker refused the job (its store is another): the task ends failed with the worker's words."""
        found = await self.tasks.read_view(task_id)
        if found is None or found[1].terminal or found[0].alive_until_ms is not None:
            return  # ended meanwhile, or a worker of this store started the job after all
        record = found[0]
        fields = logs.task_fields(task_id, record.tool, principal=record.owner, status="failed", event="refused")
        logger.error("task %s: %s", task_id, message, extra=fields)
        view = TaskView("failed", now_ms(), message, error={"code": INTERNAL_ERROR, "message": message})
        await self.store.freeze(task_id, view.to_json(), ended=ended_without_job(record, view))

    async def _settled(self, task_id: str) -> bool:
        """Read the task (freezing it if its worker is lost); True once nothing more is to be watched."""
        found = await self.tasks.read_view(task_id)
        return found is None or found[1].terminal

    def _sought(self, tool: str, alive_ms: int | None, now: int) -> _Sought | None:
        celery_task = self.tasks.celery_task(tool)  # a tool's, or a workflow member's
        if celery_task is None or self.broker is None:
            return None
        queue = self._queues.get(tool)
        if queue is None:
            try:
                queue = self._queues[tool] = queue_of(celery_task)
            except Exception:  # noqa: BLE001 - a router we cannot follow must not stop the sweep
                logger.warning("tool %r: cannot tell its queue; its lost messages go unnoticed", tool, exc_info=True)
                queue = self._queues[tool] = ""
        if not queue:
            return None
        started = alive_ms is not None
        if started and not self.tasks.redelivered_on_loss(tool):
            return _Sought(queue, True, 0.0)  # a started at-most-once job never runs again
        # A delivery from before the heartbeat ran out belongs to the lost run; one not started
        # within the heartbeat timeout of its delivery has lost its worker too (no prefetch), be it
        # the first delivery or one the lost run's message was put back for. Such an unstarted
        # message goes back to its queue even for an at-most-once tool: only one delivery can ever
        # start the job (JOB_START refuses a second), so it still runs at most once.
        stale_ms = max(alive_ms or 0, now - self.lost_ms)
        return _Sought(queue, started, stale_ms / 1000)

    async def _look_for(self, broker: RedisBroker, sought: dict[str, _Sought], now: int) -> None:
        """One WHEREABOUTS script per queue, then each task's next step."""
        store = self.store
        for queue in sorted({s.queue for s in sought.values()}):
            ids = {task_id: s.stale_before for task_id, s in sought.items() if s.queue == queue}
            for task_id, found in (await broker.whereabouts(queue, ids)).items():
                if found.where == NOWHERE:
                    await self._nowhere(task_id, sought[task_id].started, now)
                    continue
                self._missing.pop(task_id, None)
                if found.where == STALE and await broker.requeue(queue, found):
                    logger.warning("task %s: its worker was lost; its message is back in queue %r", task_id, queue)
                await store.recheck([task_id], now + self.check_ms)

    async def _nowhere(self, task_id: str, started: bool, now: int) -> None:
        """A message found nowhere: look again a period later; found nowhere then too, end the task."""
        first = self._missing.setdefault(task_id, now)
        if now - first < self.period_s * 1000:
            await self.store.recheck([task_id], now + int(self.period_s * 1000))
            return
        self._missing.pop(task_id, None)
        found = await self.tasks.read_view(task_id)
        if found is not None and not found[1].terminal:
            record = found[0]
            if (record.alive_until_ms is not None) != started or (record.alive_until_ms or 0) > now:
                return  # a job started (or beat) meanwhile: not lost
            if record.alive_until_ms is None and record.taken_until_ms is not None:
                return  # a worker took the message meanwhile: its mark tells (read_view above when run out)
            if record.cancel_ms is not None:
                # Cancelled after its job started (an unstarted one is cancelled at once): the task
                # reads cancelled once the grace runs out.
                await self.store.recheck([task_id], now + self.check_ms)
                return
            if not started and record.resume is not None and record.parked_until_ms is None:
                # Answered while parked, and its message never reached the queue (the answering server
                # died, or the broker refused it): send it again. A second copy that did arrive after all
                # is refused at its start (JOB_START), as any second delivery is.
                logger.warning("task %s: the resumed job's message is nowhere; sending it again", task_id)
                await self.tasks.resume(record, record.resume)
                return
            message = LOST_WITH_WORKER if started else LOST_BEFORE_START
            fields = logs.task_fields(task_id, record.tool, principal=record.owner, status="failed", event="lost")
            logger.warning("task %s: %s", task_id, message, extra=fields)
            view = TaskView("failed", now, message, error={"code": INTERNAL_ERROR, "message": message}, lost=True)
            await self.store.freeze(task_id, view.to_json(), ended=lost_entry(record, view))
        await self.store.forget_live([task_id])

    async def aclose(self) -> None:
        if self.broker is not None:
            await self.broker.aclose()
