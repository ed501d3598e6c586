"""JobContext: what a running job uses to talk to its MCP task.

Worker tier: imports celery and redis, never mcp.server. The context of the job running
in this thread is a ContextVar, set and reset around each run by `mcp_celery.worker`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult

from mcp_celery.errors import InputNotSupported, InputTimeout, TaskCancelled
from mcp_celery.inputs import elicitation, missing_capability, roots_request, sampling
from mcp_celery.runtime import Runtime, now_ms

if TYPE_CHECKING:
    from celery import Task

__all__ = ["JobContext", "current_context"]

logger = logging.getLogger(__name__)

INPUT_REQUIRED_STATE = "INPUT_REQUIRED"
#: At most one progress event per task this often: jobs may call status() in a tight loop.
PROGRESS_EVENT_INTERVAL_S = 0.5

_current: ContextVar[JobContext | None] = ContextVar("mcp_celery_job_context", default=None)


def current_context() -> JobContext | None:
    """The JobContext of the job running in this thread, if any."""
    return _current.get()


class JobContext:
    """The job's handle on its MCP task. Passed to tools that declare a `JobContext` parameter.

    A job started outside MCP (e.g. `my_tool.delay(...)` from other code) gets a detached
    context: `status()` still reports progress, it is never cancelled, and asking for
    input raises `InputNotSupported`.
    """

    def __init__(self, task: Task[Any, Any], rt: Runtime, fields: Mapping[str, str] | None) -> None:
        self._task = task
        self._rt = rt
        self._fields = dict(fields or {})
        self._round = 0
        self.asked = False
        self.task_id: str = str(task.request.id)
        self.capabilities: dict[str, Any] = json.loads(self._fields.get("caps") or "{}")
        self.first_answers: dict[str, dict[str, Any]] = json.loads(self._fields.get("first") or "{}")
        self._unsent_progress: str | None = None
        self._next_progress_event = 0.0

    @property
    def attached(self) -> bool:
        """True when the job runs for an MCP `tools/call`."""
        return bool(self._fields)

    @property
    def cancelled(self) -> bool:
        """True once the client has cancelled the task."""
        return self.attached and self._rt.sync_store.cancel_requested(self.task_id)

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
        self._task.update_state(state="PROGRESS", meta={"message": message})
        self._unsent_progress = message
        self.check_cancelled()

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
            return
        deadline = time.monotonic() + seconds
        self.check_cancelled()
        store = self._rt.sync_store
        while (left := deadline - time.monotonic()) > 0:
            if store.wait_bell(self.task_id, left) and store.cancel_requested(self.task_id):
                store.ring(self.task_id)
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
        store = self._rt.sync_store
        self.asked = True
        cancel, answers = store.post_inputs(self.task_id, encoded, now_ms())
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
        if not self.attached:
            raise InputNotSupported("this job was not started through MCP, so there is no client to ask")
        if self._fields.get("sync"):
            raise InputNotSupported(
                "the tool was called synchronously (the client did not declare the tasks extension), so the job "
                "cannot ask for input; make tools that ask task='required'"
            )
        if not requests:
            raise ValueError("ask() needs at least one request")
        for name, request in requests.items():
            reason = missing_capability(request, self.capabilities)
            if reason:
                raise InputNotSupported(f"cannot send input request {name!r}: {reason}")

    def _wait_for_answers(self, keys: list[str], timeout: float | None) -> dict[str, str]:
        store = self._rt.sync_store
        self._task.update_state(state=INPUT_REQUIRED_STATE, meta={"message": "waiting for input", "keys": keys})
        self._unsent_progress = None  # older than the question
        self._send_event("task-input_required", keys=keys, result="waiting for input")
        deadline = time.monotonic() + (self._rt.settings.input_timeout_s if timeout is None else timeout)
        while True:
            # One blocking call per wake-up: the bell rings on every answer and on cancel.
            rang = store.wait_bell(self.task_id, deadline - time.monotonic())
            cancel, answers = store.poll_answers(self.task_id, keys)
            if not cancel and len(answers) < len(keys) and not rang and time.monotonic() >= deadline:
                store.withdraw_inputs(self.task_id, [k for k in keys if k not in answers])
                # An answer taken between the poll and the withdrawal was acked to the client: keep it.
                cancel, answers = store.poll_answers(self.task_id, keys)
                if not cancel and len(answers) < len(keys):
                    raise InputTimeout(f"no answer to {sorted(set(keys) - set(answers))} within the timeout")
            if cancel or len(answers) == len(keys):
                # Another execution of this task (a duplicate delivery) may be blocked on the bell too.
                store.ring(self.task_id)
                if cancel:
                    raise TaskCancelled(self.task_id)
                break
        self._task.update_state(state="STARTED", meta={"message": "running"})
        # Celery's event state ranks custom states (INPUT_REQUIRED) above STARTED and would take a
        # plain task-started for a late, out-of-order event: the explicit state field overrides it.
        self._send_event("task-started", state="STARTED", result="running")
        return answers

    def _send_event(self, event: str, **fields: Any) -> None:
        # Flower learns of custom states only through events; a lost event must not fail the job.
        try:
            self._task.send_event(event, **fields)
        except Exception:  # noqa: BLE001
            logger.warning("could not send the %s event for task %s", event, self.task_id, exc_info=True)
