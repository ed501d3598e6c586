"""JobContext: what a running job uses to talk to its MCP task.

Worker tier: imports celery and redis, never `mcp` (whose package loads the SDK's server). The
context is a facade: storage, the doorbell loops and the record codec live in the store; the
code that runs a job (`mcp_celery.worker.execution`) makes the context current around the run
with `activate`, as rq's `Job.perform` sets its current job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult

from mcp_celery.errors import InputNotSupported, InputTimeout, TaskCancelled
from mcp_celery.inputs import elicitation, missing_capability, roots_request, sampling
from mcp_celery.protocol import now_ms
from mcp_celery.status import READY_STATES
from mcp_celery.store.schema import TaskRecord
from mcp_celery.store.sync import SyncStore

if TYPE_CHECKING:
    from celery import Task

__all__ = ["INPUT_REQUIRED_STATE", "JobContext", "activate", "current_context"]

logger = logging.getLogger(__name__)

#: The custom Celery state of a job waiting for answers (Flower shows it).
INPUT_REQUIRED_STATE = "INPUT_REQUIRED"
#: At most one progress event per task this often: jobs may call status() in a tight loop.
PROGRESS_EVENT_INTERVAL_S = 0.5

_current: ContextVar[JobContext | None] = ContextVar("mcp_celery_job_context", default=None)


def current_context() -> JobContext | None:
    """The JobContext of the job running in this thread, if any."""
    return _current.get()


@contextmanager
def activate(ctx: JobContext) -> Iterator[JobContext]:
    """Make `ctx` the current context for the duration of a job run."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        assert _current.get() is ctx, "the job context changed under a running job"
        _current.reset(token)


class JobContext:
    """The job's handle on its MCP task. Passed to tools that declare a `JobContext` parameter.

    A job started outside MCP (e.g. `my_tool.delay(...)` from other code) gets a detached
    context: `status()` still reports progress, it is never cancelled, and asking for
    input raises `InputNotSupported`.
    """

    def __init__(
        self, task: Task[Any, Any], store: SyncStore, record: TaskRecord | None, *, input_timeout_s: float
    ) -> None:
        self._task = task
        self._store = store
        self._record = record
        self._input_timeout_s = input_timeout_s
        self._round = 0
        self._asked = False
        self._unsent_progress: str | None = None
        self._next_progress_event = 0.0
        self.task_id: str = str(task.request.id)

    @property
    def attached(self) -> bool:
        """True when the job runs for an MCP `tools/call`."""
        return self._record is not None

    @property
    def capabilities(self) -> dict[str, Any]:
        """The client capabilities declared on the `tools/call` that created the task."""
        return {} if self._record is None else dict(self._record.capabilities)

    @property
    def first_answers(self) -> dict[str, dict[str, Any]]:
        """Answers to the tool's `ask_first` questions, by key."""
        return {} if self._record is None else dict(self._record.first_answers)

    @property
    def asked_for_input(self) -> bool:
        """Whether this run posted input requests (so the task owns answers to expire)."""
        return self._asked

    @property
    def cancelled(self) -> bool:
        """True once the client has cancelled the task."""
        return self.attached and self._store.cancel_requested(self.task_id)

    def check_cancelled(self) -> None:
        """A cancel checkpoint.

        Raises:
            TaskCancelled: the client cancelled the task.
        """
        self._send_unsent_progress()
        if self.cancelled:
            raise TaskCancelled(self.task_id)

    def status(self, message: str) -> None:
        """Report progress as the task's `statusMessage`; also a cancel checkpoint.

        Raises:
            TaskCancelled: the client cancelled the task.
        """
        if self.attached:
            self._store.progress(self.task_id, {"status": "PROGRESS", "result": {"message": message}})
        else:
            self._task.update_state(state="PROGRESS", meta={"message": message})
        self._unsent_progress = message
        self.check_cancelled()

    def report_state(self, state: str, meta: Any) -> None:
        """Show a state the job stored the Celery way (`update_state`) in its MCP task too."""
        if self.attached and state not in READY_STATES:
            self._store.progress(self.task_id, {"status": state, "result": meta})

    def _send_unsent_progress(self) -> None:
        """Show the latest status in Flower, at most once per PROGRESS_EVENT_INTERVAL_S.

        `update_state` sends no event, and Flower knows only events. A `task-progress` event makes
        Flower's state PROGRESS (as in the result backend) with the message in `result`, the one
        free-form field Flower shows and searches. A message held back is sent by the next
        checkpoint after the interval; none is sent once the job has ended, where it would only
        overwrite the real result. (No timer thread: the event producer is not thread-safe.)
        """
        if self._unsent_progress is None or time.monotonic() < self._next_progress_event:
            return
        self._send_event("task-progress", result=self._unsent_progress)
        self._unsent_progress = None
        self._next_progress_event = time.monotonic() + PROGRESS_EVENT_INTERVAL_S

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the client cancels.

        Raises:
            TaskCancelled: the client cancelled the task (before or during the sleep).
        """
        if not self.attached:
            time.sleep(seconds)
        elif self._store.sleep_unless_cancelled(self.task_id, seconds):
            raise TaskCancelled(self.task_id)

    def ask(self, requests: Mapping[str, Mapping[str, Any]], timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Send input requests to the client and block until every one is answered.

        Args:
            requests: your key → an input request (see `mcp_celery.elicitation`,
                `mcp_celery.sampling`, `mcp_celery.roots_request`). The keys on the wire
                are generated from yours, unique for the task's life.
            timeout: seconds to wait; default the `input_timeout_s` setting.

        Returns:
            The raw answers (an ElicitResult, CreateMessageResult or ListRootsResult as a
            dict), by your keys. After a redelivery, answers given before are returned
            at once instead of asking again.

        Raises:
            InputNotSupported: the tool was called synchronously, outside MCP, or the
                client did not declare the capability a request needs.
            InputTimeout: not every request was answered in time.
            TaskCancelled: the client cancelled the task while the job waited.
        """
        self._check_can_ask(requests)
        self._round += 1
        wire = {name: f"{name}-{self._round}" for name in requests}
        encoded = {wire[name]: json.dumps(dict(request)) for name, request in requests.items()}
        self._asked = True
        cancel, answers = self._store.post_inputs(self.task_id, encoded, now_ms())
        if cancel:
            raise TaskCancelled(self.task_id)
        if len(answers) < len(wire):
            answers = self._wait_for_answers(list(encoded), timeout)
        return {name: json.loads(answers[key]) for name, key in wire.items()}

    def elicit(self, message: str, schema: Mapping[str, Any], timeout: float | None = None) -> ElicitResult:
        """Ask the user to fill in a form; returns their answer (accept, decline or cancel).

        Raises: as `ask`.
        """
        answer = self.ask({"elicit": elicitation(message, schema)}, timeout)["elicit"]
        return ElicitResult.model_validate(answer)

    def sample(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        max_tokens: int = 1000,
        timeout: float | None = None,
        **params: Any,
    ) -> CreateMessageResult:
        """Ask the client's LLM for a completion (`sampling/createMessage`).

        Raises: as `ask`.
        """
        answer = self.ask({"sample": sampling(messages, max_tokens, **params)}, timeout)["sample"]
        return CreateMessageResult.model_validate(answer)

    def roots(self, timeout: float | None = None) -> ListRootsResult:
        """Ask the client for its roots (`roots/list`).

        Raises: as `ask`.
        """
        return ListRootsResult.model_validate(self.ask({"roots": roots_request()}, timeout)["roots"])

    def _check_can_ask(self, requests: Mapping[str, Mapping[str, Any]]) -> None:
        if self._record is None:
            raise InputNotSupported("this job was not started through MCP, so there is no client to ask")
        if self._record.sync:
            raise InputNotSupported(
                "the tool was called synchronously (the client did not declare the tasks extension), so the job "
                "cannot ask for input; make tools that ask task_mode='required'"
            )
        if not requests:
            raise ValueError("ask() needs at least one request")
        for name, request in requests.items():
            reason = missing_capability(request, self._record.capabilities)
            if reason:
                raise InputNotSupported(f"cannot send input request {name!r}: {reason}")

    def _wait_for_answers(self, keys: list[str], timeout: float | None) -> dict[str, str]:
        # The job parks in a custom Celery state, for Celery's own result backend and its callers; in
        # the record, the posted requests already make the task input_required.
        self._store_celery_state(INPUT_REQUIRED_STATE, {"message": "waiting for input", "keys": keys})
        self._unsent_progress = None  # older than the question
        self._send_event("task-input_required", keys=keys, result="waiting for input")
        outcome = self._store.wait_for_answers(
            self.task_id, keys, self._input_timeout_s if timeout is None else timeout
        )
        if outcome.cancelled:
            raise TaskCancelled(self.task_id)
        if outcome.missing:
            raise InputTimeout(f"no answer to {list(outcome.missing)} within the timeout")
        self._store_celery_state("STARTED", {"message": "running"})
        # Celery's event state ranks custom states (INPUT_REQUIRED) above STARTED and would take a
        # plain task-started for a late, out-of-order event: the explicit state field overrides it.
        self._send_event("task-started", state="STARTED", result="running")
        return outcome.answers

    def _store_celery_state(self, state: str, meta: dict[str, Any]) -> None:
        """What `update_state` does, without showing it in the record too (the record tells it already)."""
        self._task.backend.store_result(self.task_id, meta, state, request=self._task.request)

    def _send_event(self, event: str, **fields: Any) -> None:
        # Flower learns of custom states only through events; a lost event must not fail the job.
        try:
            self._task.send_event(event, **fields)
        except Exception:  # noqa: BLE001
            logger.warning("could not send the %s event for task %s", event, self.task_id, exc_info=True)
