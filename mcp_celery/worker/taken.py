"""Watching a job from the moment its worker takes the message until the job starts.

Worker tier, the worker's main process. An at-most-once job's message is acked early, when a
pool process takes the job (`Request.on_accepted`), and the job's own heartbeat begins only once
it starts (JOB_START). A worker that dies in between leaves no message in the broker and no
heartbeat to run out; with RabbitMQ nothing would ever tell. So, just before Celery acks, the
main process marks the task `taken` (a deadline, and the task in the `live` set) and beats the
mark (`TakenBeat`) until the job starts or ends. If the whole worker dies first, the mark runs
out and servers end the task `failed` (`mcp_celery.core.status`), with any broker. With a Redis
broker, whose queues servers look into, the mark is written only if the job has not started a
moment later (`TakenBeat.mark_soon`): most jobs start sooner, and cost no command for it.

Tool tasks name this module's `TakenRequest` as their `Request` (set by the decorators, as a
dotted name that only a worker resolves).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.utils.imports import symbol_by_name
from celery.worker.request import Request
from redis.exceptions import RedisError

from mcp_celery.errors import ToolDefinitionError
from mcp_celery.worker.config import worker_binding
from mcp_celery.worker.heartbeat import TakenBeat

__all__ = ["TakenRequest", "watched_request"]

logger = logging.getLogger(__name__)


class _WatchesTheAck:
    """What `TakenRequest` adds to a Celery request class (a mixin, so a tool's own class keeps its code)."""

    task: Task[Any, Any]
    task_id: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The worker runs a subclass of each task's Request (Celery's `create_request_cls`) whose own
        # on_success does not call super(): wrapped here, or a job that succeeds would never end its
        # watch, and the deferred mark would cost a script call a moment after every such job.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("on_success")
        if own is not None:
            cls.on_success = _stopping_first(own)  # type: ignore[method-assign]

    def on_accepted(self, pid: str, time_accepted: float) -> None:
        if not self.task.acks_late:  # late ack: the broker keeps the message until the job ends
            _mark_taken(self.task, self.task_id)
        super().on_accepted(pid, time_accepted)  # type: ignore[misc]

    def on_success(self, failed__retval__runtime: tuple[Any, Any, Any], **kwargs: Any) -> None:
        _stop_beating(self.task, self.task_id)
        super().on_success(failed__retval__runtime, **kwargs)  # type: ignore[misc]

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        _stop_beating(self.task, self.task_id)
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)  # type: ignore[misc]


class TakenRequest(_WatchesTheAck, Request):
    """Celery's request, marking an early-acked job's task `taken` before the ack."""


def watched_request(request_class: type[Request] | str, tool_name: str) -> type[Request]:
    """A tool's own Celery request class, watched from the ack as `TakenRequest` is.

    Raises:
        ToolDefinitionError: the class is not a Celery `Request`.
    """
    found = symbol_by_name(request_class) if isinstance(request_class, str) else request_class
    if not (isinstance(found, type) and issubclass(found, Request)):
        raise ToolDefinitionError(f"tool {tool_name!r}: its Request class {found!r} is not a Celery Request")
    if issubclass(found, _WatchesTheAck):
        return found
    return type(f"Watched{found.__name__}", (_WatchesTheAck, found), {"__module__": found.__module__})


def _stopping_first(on_success: Callable[..., None]) -> Callable[..., None]:
    """`on_success` that ends the request's watch first (a request of a job that failed ends it in on_failure)."""

    @functools.wraps(on_success)
    def stopping_first(self: Any, failed__retval__runtime: tuple[Any, Any, Any], **kwargs: Any) -> None:
        _stop_beating(self.task, self.task_id)
        on_success(self, failed__retval__runtime, **kwargs)

    return stopping_first


def _taken_beat(task: Task[Any, Any]) -> TakenBeat:
    worker = worker_binding(task.app)
    return TakenBeat.of_process(worker.main_process_store, worker.settings.worker_lost_timeout_s)


def _mark_taken(task: Task[Any, Any], task_id: str) -> None:
    beat = _taken_beat(task)
    if worker_binding(task.app).queue_check_s is not None:
        beat.mark_soon(task_id)  # servers look for the message meanwhile: see TakenBeat
        return
    try:
        # One round trip in the main process, before the ack: marked after it, a worker dying in
        # between would leave the task `working` for ever again. Its client has a socket timeout: a
        # Redis that hangs must not stall the worker's main loop (the ack, every other job, control).
        if beat.store.mark_taken(task_id, beat.deadline_ms()):
            beat.add(task_id)
    except (RedisError, OSError):
        # The job cannot start without Redis either; the ack goes ahead as Celery would do it.
        logger.warning("task %s: could not mark its message taken before the ack", task_id, exc_info=True)


def _stop_beating(task: Task[Any, Any], task_id: str) -> None:
    """The request ended in this process (the job ran, or its pool process was lost): no more beats."""
    if not task.acks_late:
        _taken_beat(task).discard(task_id)
