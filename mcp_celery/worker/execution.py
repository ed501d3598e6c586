"""Running one job: the code around every MCP tool's Celery task body.

Worker tier. Only for jobs started through MCP (those with a task record), `run_job` refuses
to start a cancelled task or one that has ended already, or to run an at-most-once job a
second time, makes the JobContext current, turns a cancellation into Celery's REVOKED state,
stores the job's outcome in the record (the MCP side reads nothing else), and shortens the
record's life to the TTL once the job is over (or, when its process is being stopped mid-job,
ends its heartbeat at once). Jobs started the ordinary Celery way run exactly as before.

Some endings happen outside the job, in the worker's main process: a pool process lost, a hard
time limit, a revoke of a queued or terminated job. Celery reports those with its
`task_failure` and `task_revoked` signals, which store the outcome the same way.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from redis.exceptions import RedisError

from mcp_celery import logs, tracing
from mcp_celery.core.binding import STORE_HEADER, AppBinding
from mcp_celery.core.status import ended_entry
from mcp_celery.errors import ProtocolError, StoreMismatch, TaskCancelled
from mcp_celery.protocol import INTERNAL_ERROR, now_ms
from mcp_celery.store.ended import EndedEntry
from mcp_celery.store.schema import Lifetimes, TaskRecord
from mcp_celery.store.sync import SyncStore
from mcp_celery.worker import outcome, parking
from mcp_celery.worker.approvals import ApprovalConfig
from mcp_celery.worker.artifacts import ArtifactSink
from mcp_celery.worker.config import worker_binding
from mcp_celery.worker.context import JobContext, activate
from mcp_celery.worker.heartbeat import Heartbeat
from mcp_celery.worker.output import OutputSink
from mcp_celery.worker.workflow import WorkflowStarted, after_member

__all__ = ["RERUNS_USED_UP", "is_tool_task", "run_job"]

logger = logging.getLogger(__name__)

#: Set on an exception whose outcome `run_job` stored, so the task_failure signal skips it.
_STORED = "_mcp_celery_outcome_stored"
#: How long the main process keeps trying to store an outcome while Redis is unreachable.
OUTSIDE_RETRY_S = 5.0
#: Set on the task body `run_job` wraps.
WRAPPED = "_mcp_celery_wrapped"
#: Why a `retry_on_worker_loss` job that lost its worker too often is not run again.
RERUNS_USED_UP = "the job lost its worker {times} times; it is not run again (retry_on_worker_loss)"


def is_tool_task(task: Any) -> bool:
    """Whether `task` runs through `run_job` (an MCP tool)."""
    return bool(getattr(getattr(task, "run", None), WRAPPED, False))


def run_job(celery_task: Task[Any, Any], run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run `run(*args, **kwargs)` as the body of `celery_task`'s current request."""
    worker = worker_binding(celery_task.app)
    store = worker.store
    settings = worker.settings
    heartbeat = Heartbeat.of_process(store, settings.worker_lost_timeout_s)
    task_id: str | None = celery_task.request.id
    # No record: an ordinary Celery call (or an eager run), not an MCP task; it runs as before.
    attached = bool(task_id) and not celery_task.request.is_eager
    started_ms = now_ms()
    record = _start(celery_task, store, heartbeat) if attached else None
    if record is None and attached:
        _refuse_another_store(celery_task, worker.binding)
    if record is None:
        with activate(JobContext(celery_task, store, None, input_timeout_s=settings.input_timeout_s)):
            return run(*args, **kwargs)
    queue_check_s = worker.queue_check_s
    ctx = JobContext(
        celery_task,
        store,
        record,
        input_timeout_s=settings.input_timeout_s,
        queue_check_s=queue_check_s,
        heartbeat=heartbeat,
        park_after_s=None if record.sync else parking.park_after_s(celery_task, settings.park_after_s),
        # A workflow member's artifacts and output are its MCP task's: the task the client holds and reads.
        artifacts=ArtifactSink(store, record.parent or record.task_id, settings.artifacts, settings.artifact_max_bytes),
        approvals=ApprovalConfig.from_settings(settings),
        output=OutputSink(store, record.parent or record.task_id, settings.output_keep_bytes),
    )
    heartbeat.node = heartbeat.node or str(celery_task.request.hostname or "")
    # Its listeners hear of the start from the heartbeat, unless an earlier delivery's outcome stands.
    announce = (record.parent or record.task_id) if record.outcome is None else None
    heartbeat.add(record.task_id, record.tool, started_ms, announce)
    stopped = True
    try:
        with tracing.job_span(celery_task.request, record.tool, record.task_id):
            value = _run_attached(celery_task, run, args, kwargs, ctx, store, heartbeat, record, started_ms)
        stopped = False
        return value
    except (Exception, TaskCancelled):
        stopped = False
        raise
    finally:
        if record.parent is not None and not stopped:  # a workflow member: its MCP task may take a step now
            _after_member(celery_task, store, record.parent)


def _run_attached(
    celery_task: Task[Any, Any],
    run: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    ctx: JobContext,
    store: SyncStore,
    heartbeat: Heartbeat,
    record: TaskRecord,
    started_ms: int,
) -> Any:
    """Run the job's body in its context, then store how it ended (or that it handed over to a workflow)."""
    ended: dict[str, Any] | None = None
    interrupted = parked = False
    handed_over: WorkflowStarted | None = None
    with activate(ctx):
        try:
            if record.cancel_ms is not None:
                ended = outcome.revoked("cancelled before start")
                _mark_cancelled(celery_task, "cancelled before start")
            _refuse_endless_reruns(celery_task, store, record.task_id)
            value = run(*args, **kwargs)
            ended = outcome.succeeded(value)
            return value
        except WorkflowStarted as started:
            # The task follows its workflow now; Celery's own task ends here, saying so.
            handed_over = started
            return {"workflow": started.kind, "members": started.members}
        except TaskCancelled:
            ended = outcome.revoked("cancelled by client")
            _mark_cancelled(celery_task, "cancelled by client")
        except parking.JobParked:
            # The run ends at its open question; the answer sends the message again. Ignore: Celery acks
            # the message and stores nothing over the INPUT_REQUIRED state the question left.
            parked = True
            raise Ignore("parked at an open question") from None
        except Retry:
            store.progress(record.task_id, {"status": "RETRY"}, record.parent)  # the job runs again later
            raise
        except (Ignore, Reject):
            raise  # Celery's own control flow: the main process reports what follows
        except Exception as exc:
            ended = outcome.failed(exc, traceback.format_exc())
            _flag_stored(exc)
            raise
        except BaseException:
            # SystemExit here is billiard's SIGTERM handler: the pool process is being stopped
            # (a cold shutdown, a terminate) with the job unfinished.
            interrupted = True
            raise
        finally:
            if parked:
                heartbeat.discard(record.task_id)  # the record has no heartbeat now (PARK)
            elif handed_over is not None:
                heartbeat.discard(record.task_id)
                store.handed_over(record.task_id, str(handed_over))
            else:
                _finish(ctx, store, heartbeat, record, ended, interrupted, started_ms)


def _finish(
    ctx: JobContext,
    store: SyncStore,
    heartbeat: Heartbeat,
    record: TaskRecord,
    ended: dict[str, Any] | None,
    interrupted: bool,
    started_ms: int,
) -> None:
    """Store how the job ended; then its artifacts in Redis and its live output live as long as the record."""
    entry = None if ended is None else _entry(record, ended, started_ms, ctx.input_wait_ms)
    # This run's artifacts or output, or (it started before: a park, a redelivery) an earlier run's.
    artifacts = ctx.kept_bytes or record.alive_until_ms is not None
    _end(store, heartbeat, record, asked=ctx.asked_for_input, ended=ended, interrupted=interrupted, entry=entry)
    if artifacts and not interrupted:
        _expire_artifacts(store, record.task_id)


def _expire_artifacts(store: SyncStore, task_id: str) -> None:
    """The bytes of the task's artifacts in Redis and its output live as long as its record, from its end on."""
    try:
        store.expire_artifacts(task_id, output=True)
    except (RedisError, OSError):  # they expire anyway, a job's length after the record at most
        logger.warning("task %s: could not expire its artifacts with the record", task_id, exc_info=True)


def _after_member(celery_task: Task[Any, Any], store: SyncStore, parent_id: str) -> None:
    """Let the MCP task a member belongs to take its next step (a server reading it would, too)."""
    try:
        worker = worker_binding(celery_task.app)
        grace_ms = int(worker.settings.cancel_grace_s * 1000)
        after_member(celery_task.app, store, parent_id, grace_ms=grace_ms, check_after_s=worker.queue_check_s)
    except Exception:  # noqa: BLE001 - the member's own end is stored; the next reader of the task takes the step
        logger.warning("task %s: could not take its workflow's next step", parent_id, exc_info=True)


def _start(celery_task: Task[Any, Any], store: SyncStore, heartbeat: Heartbeat) -> TaskRecord | None:
    """The job's record (None: not an MCP task); Ignore for a second delivery of an at-most-once job."""
    again = _may_run_again(celery_task)
    life_s = _record_life_s(celery_task, store.lifetimes)
    task_id = str(celery_task.request.id)
    record = store.job_started(task_id, heartbeat.period_ms, life_s, may_run_again=again)
    if record is not None and record.final is not None:
        # The task ended while its message was in flight (cancelled before its start, or reported lost
        # with a dead worker that had taken it): what clients were told stands, so the job does not run.
        reason = str(record.final.get("message") or "the task ended before its job started")
        logger.warning("task %s: not run (the task has ended already: %s)", task_id, reason)
        if record.final.get("status") == "cancelled":
            _mark_cancelled(celery_task, reason)  # Celery's backend and Flower show REVOKED, not STARTED
        raise Ignore(reason)
    if record is not None and record.alive_until_ms is not None and not again:
        # At most once: a second delivery (a message Celery restored at a cold shutdown, a
        # visibility timeout) never runs the job again; the first run's outcome stands.
        logger.warning("task %s: not run again (at-most-once; an earlier delivery started it)", task_id)
        raise Ignore("an earlier delivery of this at-most-once job started it")
    if record is not None and logger.isEnabledFor(logging.INFO):  # the fields cost a hash of the principal
        fields = logs.task_fields(task_id, record.tool, principal=record.owner, status="working", event="started")
        logger.info("task %s: job started", task_id, extra=fields)
    return record


def _refuse_another_store(celery_task: Task[Any, Any], binding: AppBinding) -> None:
    """Refuse a job whose task a server created in another store: its record is there, not in ours.

    Run as an ordinary Celery call instead, the job would report to nobody and its task would read
    `queued` until the servers gave its message up for lost. A message without the header (a job
    queued by Celery's own API, a resumed or workflow member's message) is not checked.

    Raises:
        StoreMismatch: a Celery failure naming both stores; servers end the task with its message.
    """
    theirs = getattr(celery_task.request, STORE_HEADER, None)
    if not isinstance(theirs, str) or theirs == binding.identity:
        return
    exc = StoreMismatch(
        f"worker {celery_task.request.hostname} uses another task store: set MCP_CELERY_REDIS_URL (and "
        f"MCP_CELERY_KEY_PREFIX) the same on servers and workers (the task's server: store {theirs}; "
        f"this worker: {binding.described})"
    )
    logger.error("task %s: not run: %s", celery_task.request.id, exc)
    _flag_stored(exc)  # nothing to store in this worker's store: the task is not there
    raise exc


def _may_run_again(celery_task: Task[Any, Any]) -> bool:
    """At-least-once tools (late ack, reject on worker loss) and Celery retries may run a job again."""
    at_least_once = bool(celery_task.acks_late and celery_task.reject_on_worker_lost)
    return at_least_once or bool(celery_task.request.retries)


def _end(
    store: SyncStore,
    heartbeat: Heartbeat,
    record: TaskRecord,
    *,
    asked: bool,
    ended: dict[str, Any] | None,
    interrupted: bool,
    entry: EndedEntry | None = None,
) -> None:
    task_id = record.task_id
    if interrupted:
        heartbeat.discard(task_id)  # first, or a beat could push the deadline on again
        try:
            # The heartbeat ends now, so servers report the task at once instead of a period later.
            store.job_interrupted(task_id, now_ms(), record.parent)
        except (RedisError, OSError):
            logger.warning("task %s: could not record that the job was stopped", task_id, exc_info=True)
        fields = logs.task_fields(task_id, record.tool, principal=record.owner, event="interrupted")
        logger.warning("task %s: job stopped before it ended (its process is being stopped)", task_id, extra=fields)
        return
    try:
        store.job_ended(task_id, asked=asked, outcome=ended, channel=record.parent, ended=entry)
    finally:
        # Only now: while the outcome waits for Redis, the job still counts as alive.
        heartbeat.discard(task_id)
    if ended is not None and entry is not None:
        tracing.annotate(task_id, record.tool, entry.status)
        if logger.isEnabledFor(logging.INFO):
            fields = logs.task_fields(task_id, record.tool, principal=record.owner, status=entry.status, event="ended")
            logger.info("task %s: job ended, %s (%s)", task_id, entry.status, ended["status"], extra=fields)


def _entry(record: TaskRecord, ended: dict[str, Any], started_ms: int, input_ms: int) -> EndedEntry:
    """The ended stream's entry for this run's end (`mcp_celery.store.ended`)."""
    created = record.created_ms
    return ended_entry(record.task_id, record.tool, ended, created_ms=created, started_ms=started_ms, input_ms=input_ms)


#: The Celery task attribute `retry_on_worker_loss` sets: how many times the job may run again.
MAX_RERUNS_ATTRIBUTE = "mcp_celery_max_reruns"


def _refuse_endless_reruns(celery_task: Task[Any, Any], store: SyncStore, task_id: str) -> None:
    """End a `retry_on_worker_loss` job that lost its worker too often (one that kills it every time).

    Raises:
        ProtocolError: the job has run its allowed number of times already; the task ends failed.
    """
    allowed = getattr(celery_task, MAX_RERUNS_ATTRIBUTE, None)
    if not allowed:
        return  # at-most-once: nothing counted, no extra round trip
    runs = store.count_run(task_id)
    if runs > allowed + 1:
        raise ProtocolError(INTERNAL_ERROR, RERUNS_USED_UP.format(times=runs - 1))


def _record_life_s(celery_task: Task[Any, Any], lifetimes: Lifetimes) -> int | None:
    """TTL plus this tool's own hard time limit, when it has one longer than the app's."""
    own = celery_task.time_limit
    if not own or own <= lifetimes.max_job_s:
        return None
    return lifetimes.live_for(int(own))


def _mark_cancelled(celery_task: Task[Any, Any], reason: str) -> None:
    """End the job as REVOKED; Ignore stops Celery from storing anything over it."""
    celery_task.backend.mark_as_revoked(str(celery_task.request.id), reason=reason, request=celery_task.request)
    try:
        # Celery sends no event for Ignore; without this Flower shows the task STARTED for ever. The
        # explicit state: Celery's event state ranks custom states (PROGRESS, INPUT_REQUIRED) above
        # REVOKED, so without it a job cancelled in one of them would keep showing that state.
        celery_task.send_event("task-revoked", terminated=False, expired=False, reason=reason, state="REVOKED")
    except Exception:  # noqa: BLE001
        logger.warning("could not send the task-revoked event for %s", celery_task.request.id, exc_info=True)
    raise Ignore(reason)


def _flag_stored(exc: BaseException) -> None:
    try:
        setattr(exc, _STORED, True)
    except AttributeError:  # an exception type with __slots__: the signal stores it again (first one wins)
        pass


def _store_outside_the_job(task: Any, task_id: str | None, ended: dict[str, Any]) -> None:
    if not task_id:
        return
    try:
        # Briefly: in the worker's main process a long wait would hold up every other job.
        store = worker_binding(task.app).main_process_store
        # The record is not read here: the script takes the tool and creation time from it for the entry.
        entry = ended_entry(task_id, "", ended, created_ms=0, started_ms=None)
        store.job_ended(task_id, asked=True, outcome=ended, retry_s=OUTSIDE_RETRY_S, ended=entry)
    except Exception:  # noqa: BLE001 - never break Celery's own failure path; the heartbeat still tells
        logger.warning("could not store the outcome of task %s", task_id, exc_info=True)
        return
    fields = logs.task_fields(task_id, status=entry.status, event="ended")
    logger.info("task %s: job ended outside its run, %s (%s)", task_id, entry.status, ended["status"], extra=fields)


def failed_outside_the_job(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    """A pool process lost, a hard time limit, a rejected message: the job could not store its outcome."""
    if exception is None or not is_tool_task(sender) or getattr(exception, _STORED, False):
        return
    _store_outside_the_job(sender, task_id, outcome.failed(exception))


def revoked_outside_the_job(
    sender: Any = None, request: Any = None, terminated: bool = False, expired: bool = False, **_: Any
) -> None:
    """A revoke that ended the job from outside: the message was dropped, or the process terminated.

    An at-least-once job terminated without a cancel (Celery stops late-ack jobs when the broker
    connection drops, since their message goes back to the queue) is not over: it runs again.
    """
    task_id = getattr(request, "id", None)
    if not is_tool_task(sender) or not task_id:
        return
    if terminated and sender.acks_late and sender.reject_on_worker_lost:
        try:
            if not worker_binding(sender.app).main_process_store.cancel_requested(task_id):
                return
        except Exception:  # noqa: BLE001 - unknown: let the heartbeat and the reaper tell
            return
    reason = "terminated" if terminated else "expired" if expired else "revoked"
    _store_outside_the_job(sender, task_id, outcome.revoked(reason))
