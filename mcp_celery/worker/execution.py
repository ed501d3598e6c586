"""Running one job: the code around every MCP tool's Celery task body.

Worker tier. Only for jobs started through MCP (those with a task record), `run_job` refuses
to start a cancelled task, makes the JobContext current, turns a cancellation into Celery's
REVOKED state, and shortens the record's life to the TTL once the job is over. Jobs started
the ordinary Celery way run exactly as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from mcp_celery.errors import ProtocolError, TaskCancelled
from mcp_celery.protocol import INTERNAL_ERROR
from mcp_celery.store.schema import Lifetimes
from mcp_celery.store.sync import SyncStore
from mcp_celery.worker.config import worker_binding
from mcp_celery.worker.context import JobContext, activate
from mcp_celery.worker.heartbeat import Heartbeat

__all__ = ["run_job"]

logger = logging.getLogger(__name__)


def run_job(celery_task: Task[Any, Any], run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run `run(*args, **kwargs)` as the body of `celery_task`'s current request."""
    worker = worker_binding(celery_task.app)
    store = worker.store
    heartbeat = Heartbeat.of_process(store, worker.settings.worker_lost_timeout_s)
    task_id: str | None = celery_task.request.id
    # No record: an ordinary Celery call (or an eager run), not an MCP task; it runs as before.
    attached = bool(task_id) and not celery_task.request.is_eager
    record = (
        store.job_started(str(task_id), heartbeat.deadline_ms(), _record_life_s(celery_task, store.lifetimes))
        if attached
        else None
    )
    ctx = JobContext(celery_task, store, record, input_timeout_s=worker.settings.input_timeout_s)
    if record is not None:
        heartbeat.add(record.task_id)
    with activate(ctx):
        try:
            if record is not None and record.cancel_ms is not None:
                _mark_cancelled(celery_task, "cancelled before start")
            if record is not None:
                _refuse_endless_reruns(celery_task, store, record.task_id)
            return run(*args, **kwargs)
        except TaskCancelled:
            if record is None:
                raise
            _mark_cancelled(celery_task, "cancelled by client")
        finally:
            if record is not None:
                heartbeat.discard(record.task_id)
                store.job_ended(record.task_id, asked=ctx.asked_for_input)


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
        raise ProtocolError(
            INTERNAL_ERROR, f"the job lost its worker {runs - 1} times; it is not run again (retry_on_worker_loss)"
        )


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
