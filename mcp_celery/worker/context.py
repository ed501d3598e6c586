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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast, overload

from celery import Signature
from mcp_types import CreateMessageResult, CreateMessageResultWithTools, ElicitResult, ListRootsResult

from mcp_celery import logs
from mcp_celery.core import approvals as approval
from mcp_celery.core.canvas import FAILED_HEADER
from mcp_celery.core.status import READY_STATES
from mcp_celery.core.workflows import FailurePolicy
from mcp_celery.errors import ArtifactError, InputNotSupported, InputTimeout, TaskCancelled
from mcp_celery.inputs import (
    ToolChoiceMode,
    elicitation,
    missing_capability,
    roots_request,
    sampling,
    sampling_answer_model,
)
from mcp_celery.protocol import now_ms
from mcp_celery.store.schema import TaskRecord
from mcp_celery.store.sync import MEMO_PREFIX, AnswerWait, SyncStore
from mcp_celery.worker import approvals, parking, workflow
from mcp_celery.worker.approvals import ApprovalConfig
from mcp_celery.worker.artifacts import ArtifactSink
from mcp_celery.worker.heartbeat import Heartbeat
from mcp_celery.worker.output import OutputSink, write_output

if TYPE_CHECKING:
    from celery import Task

__all__ = ["INPUT_REQUIRED_STATE", "JobContext", "activate", "current_context"]

logger = logging.getLogger(__name__)

#: The custom Celery state of a job waiting for answers (Flower shows it).
INPUT_REQUIRED_STATE = "INPUT_REQUIRED"
#: At most one progress event per task this often: jobs may call status() in a tight loop.
PROGRESS_EVENT_INTERVAL_S = 0.5

T = TypeVar("T")

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
        self,
        task: Task[Any, Any],
        store: SyncStore,
        record: TaskRecord | None,
        *,
        input_timeout_s: float,
        queue_check_s: float | None = None,
        heartbeat: Heartbeat | None = None,
        park_after_s: float | None = None,
        artifacts: ArtifactSink | None = None,
        approvals: ApprovalConfig | None = None,
        output: OutputSink | None = None,
    ) -> None:
        self._task = task
        self._artifacts, self._output = artifacts, output
        self._approvals = approvals or ApprovalConfig()
        self._heartbeat = heartbeat
        #: How long this run has waited for answers (ms): the ended stream's time in input_required.
        self.input_wait_ms = 0
        self._store = store
        self._record = record
        self._input_timeout_s = input_timeout_s
        # None: the job waits in its process for as long as the question's timeout (never parks).
        self._park_after_s = park_after_s
        self._queue_check_s = queue_check_s
        # A workflow member's changes go to its MCP task's listeners.
        self._channel = None if record is None else record.parent
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
    def failed_members(self) -> list[dict[str, Any]]:
        """In a workflow's merge step: the members that failed (`member`, `task`, `error` each); else []."""
        failed = getattr(self._task.request, FAILED_HEADER, None)
        return list(json.loads(failed)) if isinstance(failed, str) else []

    def run_workflow(
        self, work: Any, *, merge: Signature[Any] | None = None, on_failure: FailurePolicy = "fail"
    ) -> NoReturn:
        """Hand this task over to a Celery workflow, and end the job: the task follows the workflow.

        The job's worker slot is free at once; the members run on any worker, each watched like a job
        (progress, questions, cancel, a lost worker), and the task ends when the workflow does: with
        the merge step's result (its return value is the tool's result), a chain's last step's, or a
        group's `{"results": [...], "failed": [...]}`.

        `work`: a `group` or list of signatures (in parallel), a `chord`, or a `chain`; members are
        task signatures of the app, not nested canvases. `merge`: a group's merge step (it gets the
        members' results). `on_failure`: "fail" (the first failure fails the task, the others are
        cancelled) or "partial" (the merge gets the successes; `ctx.failed_members` the failures).

        Raises:
            ValueError: `work` is not a canvas this supports, or this job is a workflow's member itself.
            TaskCancelled: the task was cancelled before its workflow could start.
        """
        raise workflow.start(
            self._task, self._store, self._record, work, merge=merge, on_failure=on_failure,
            check_after_s=self._queue_check_s,
        )  # fmt: skip

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
        """Report progress as the task's `statusMessage`; also a cancel checkpoint (raises TaskCancelled)."""
        if self.attached:
            self._store.progress(self.task_id, {"status": "PROGRESS", "result": {"message": message}}, self._channel)
        else:
            self._task.update_state(state="PROGRESS", meta={"message": message})
        self._unsent_progress = message
        self.check_cancelled()

    def report_state(self, state: str, meta: Any) -> None:
        """Show a state the job stored the Celery way (`update_state`) in its MCP task too."""
        if self.attached and state not in READY_STATES:
            self._store.progress(self.task_id, {"status": state, "result": meta}, self._channel)

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

    def artifact(
        self,
        name: str,
        data: bytes | str | Iterable[bytes] | None = None,
        *,
        path: str | Path | None = None,
        mime_type: str | None = None,
    ) -> dict[str, Any]:
        """Hand over a file beside the result: `data` (bytes, text stored as UTF-8, or an iterable of bytes
        stored as it comes, never held whole) or the file at `path`.

        The final result lists every artifact as a `resource_link`; clients read it with `resources/read`
        or download it (`docs/guides/artifacts.md`). It lives as long as the task's record, also when the
        task fails or is cancelled; writing a name again replaces it. `name`: one path segment of at most
        200 printable characters, without `..`; `mime_type`: default guessed from the name.
        Returns the artifact's `resource_link` content block (`type`, `uri`, `name`, `mimeType`, `size`).

        Raises:
            ArtifactError: a bad name, neither or both of `data` and `path`, the task's artifacts in Redis
                over MCP_CELERY_ARTIFACT_MAX_BYTES, or a job run outside an MCP task.
        """
        if self._artifacts is None:
            raise ArtifactError("ctx.artifact() needs an MCP task: this job was started outside MCP")
        return self._artifacts.put(name, data, path, mime_type)

    def output(self, text: str, *, end: str = "\n") -> None:
        """Append `text` and `end` to the task's live output, `mcp-celery://tasks/{taskId}/output` (`worker.output`)."""
        write_output(self._output, self.task_id, text + end)

    @property
    def kept_bytes(self) -> bool:
        """Whether this run kept bytes beside the record (artifacts in Redis, live output) to expire with it."""
        return any(sink is not None and sink.wrote for sink in (self._artifacts, self._output))

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
        return self._ask(requests, timeout)

    def _ask(self, requests: Mapping[str, Mapping[str, Any]], timeout: float | None) -> dict[str, dict[str, Any]]:
        self._round += 1
        wire = {name: f"{name}-{self._round}" for name in requests}
        encoded = {wire[name]: json.dumps(dict(request)) for name, request in requests.items()}
        self._asked = True
        since = now_ms()  # the task reads input_required from the post on
        cancel, answers = self._store.post_inputs(self.task_id, encoded, since, self._channel)
        if cancel:
            raise TaskCancelled(self.task_id)
        if len(answers) < len(wire):
            answers = self._wait_for_answers(list(encoded), timeout, since)
        return {name: json.loads(answers[key]) for name, key in wire.items()}

    def elicit(self, message: str, schema: Mapping[str, Any], timeout: float | None = None) -> ElicitResult:
        """Ask the user to fill in a form; returns their answer (accept, decline or cancel).

        Raises: as `ask`.
        """
        answer = self.ask({"elicit": elicitation(message, schema)}, timeout)["elicit"]
        return ElicitResult.model_validate(answer)

    @overload
    def sample(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        max_tokens: int = 1000,
        timeout: float | None = None,
        *,
        tools: None = None,
        tool_choice: None = None,
        **params: Any,
    ) -> CreateMessageResult: ...

    @overload
    def sample(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        max_tokens: int = 1000,
        timeout: float | None = None,
        *,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoiceMode | None = None,
        **params: Any,
    ) -> CreateMessageResultWithTools: ...

    def sample(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        max_tokens: int = 1000,
        timeout: float | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoiceMode | None = None,
        **params: Any,
    ) -> CreateMessageResult | CreateMessageResultWithTools:
        """Ask the client's LLM for a completion (`sampling/createMessage`).

        With `tools` (MCP `Tool`s as JSON) the model may answer with `tool_use` blocks instead of
        text, and the result is a `CreateMessageResultWithTools`: run the tools and sample again
        with their `tool_result`s. The client must declare `sampling.tools` for that.

        Raises: as `ask`.
        """
        request = sampling(messages, max_tokens, tools=tools, tool_choice=tool_choice, **params)
        answer = self.ask({"sample": request}, timeout)["sample"]
        return sampling_answer_model(request["params"]).model_validate(answer)

    def approve(
        self,
        message: str,
        *,
        approvers: Sequence[str] | None = None,
        details: Mapping[str, Any] | None = None,
        four_eyes: bool = True,
        timeout: float | None = None,
    ) -> approval.Approval:
        """Ask a named person to decide on the server's approval page (`mcp_celery.worker.approvals`).

        `approvers`: a list of principals who may decide (None: anyone signed in but the caller; a `str`
        raises TypeError); `details`: a small JSON object shown on the page; `four_eyes`: the caller may
        not decide (only an explicit False lets them); `timeout`: seconds to wait (default `input_timeout_s`).

        Raises:
            InputNotSupported: not started through MCP, called synchronously, or MCP_CELERY_PUBLIC_URL unset.
            InputTimeout: nobody decided in time.
            TaskCancelled: the task was cancelled (the page then says the approval was withdrawn).
        """
        record = self._attached_record()
        wire_key = f"approval-{self._round + 1}"  # the key _ask gives it: the same on every run
        approval_id = self.once(f"{wire_key}:id", approval.new_approval_id)
        asked = approvals.Asked(self._approvals, approval_id, record.tool, record.owner, message)
        request = asked.request(approvers, details, four_eyes, self._task.request)
        keep_s = int(self._input_timeout_s if timeout is None else timeout) + approvals.KEPT_AFTER_TIMEOUT_S
        self._store.register_approval(approval_id, self.task_id, wire_key, json.dumps(request), now_ms(), keep_s)
        if self._approvals.webhook:
            self.once(f"{wire_key}:webhook", asked.notify)  # one POST, however often the job runs again
        decided = approval.Approval.from_answer(self._ask({"approval": request}, timeout)["approval"])
        verdict, by = "approved" if decided.approved else "denied", logs.principal_digest(decided.by)
        logger.info("task %s: %s by %s", self.task_id, verdict, by, extra=self._fields(None, verdict))
        self._send_event("task-approval", approved=decided.approved, by=by, result=f"{verdict} by {by}")
        return decided

    def roots(self, timeout: float | None = None) -> ListRootsResult:
        """Ask the client for its roots (`roots/list`). Raises: as `ask`."""
        return ListRootsResult.model_validate(self.ask({"roots": roots_request()}, timeout)["roots"])

    def _attached_record(self) -> TaskRecord:
        if self._record is None:
            raise InputNotSupported("this job was not started through MCP, so there is no client to ask")
        if self._record.sync:
            raise InputNotSupported(
                "the tool was called synchronously (a task_mode='forbidden' tool, or a client without the tasks "
                "extension while MCP_CELERY_TOOL_FALLBACK is false), so the job cannot ask for input"
            )
        return self._record

    def _check_can_ask(self, requests: Mapping[str, Mapping[str, Any]]) -> None:
        record = self._attached_record()
        if not requests:
            raise ValueError("ask() needs at least one request")
        if clash := [name for name in requests if name.startswith(MEMO_PREFIX)]:
            raise ValueError(f"request keys may not start with {MEMO_PREFIX!r} (once() keeps its values so): {clash}")
        for name, request in requests.items():
            reason = missing_capability(request, record.capabilities)
            # A task created without the extension is answered through the task_respond tool (by the
            # client's model, asking its user where needed), whatever capabilities the client declared.
            if reason and not record.plain and approval.approval_of(request) is None:
                raise InputNotSupported(f"cannot send input request {name!r}: {reason}")

    def _wait_for_answers(self, keys: list[str], timeout: float | None, since: int) -> dict[str, str]:
        # The job parks in a custom Celery state, for Celery's own result backend and its callers; in
        # the record, the posted requests already make the task input_required.
        self._store_celery_state(INPUT_REQUIRED_STATE, {"message": "waiting for input", "keys": keys})
        logger.info("task %s: waiting for input", self.task_id, extra=self._fields("input_required"))
        self._unsent_progress = None  # older than the question
        self._send_event("task-input_required", keys=keys, result="waiting for input")
        if self._heartbeat is not None:
            self._heartbeat.waiting(self.task_id, since)  # the worker's beats say so (`mcp-celery top`)
        try:
            outcome = self._wait_or_park(keys, self._input_timeout_s if timeout is None else timeout, since)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.waiting(self.task_id, None)
            self.input_wait_ms += now_ms() - since
        if outcome.cancelled:
            raise TaskCancelled(self.task_id)
        if outcome.missing:
            raise InputTimeout(f"no answer to {list(outcome.missing)} within the timeout")
        logger.info("task %s: answered; the job goes on", self.task_id, extra=self._fields("working", "answered"))
        self._store_celery_state("STARTED", {"message": "running"})
        # Celery's event state ranks custom states (INPUT_REQUIRED) above STARTED and would take a
        # plain task-started for a late, out-of-order event: the explicit state field overrides it.
        self._send_event("task-started", state="STARTED", result="running")
        return outcome.answers

    def _wait_or_park(self, keys: list[str], timeout_s: float, since: int) -> AnswerWait:
        """Wait for the answers in this process for the park window at most, then park (`parking`).

        Raises:
            JobParked: the job parked; its run ends, and the answer runs it again.
        """
        window = self._park_after_s
        if window is None or window >= timeout_s:
            return self._store.wait_for_answers(self.task_id, keys, timeout_s)
        outcome = self._store.wait_for_answers(self.task_id, keys, window, withdraw=False)
        if not outcome.missing:
            return outcome
        until_ms = since + int(timeout_s * 1000)
        parked = self._store.park(self.task_id, keys, until_ms, parking.resume_signature(self._task))
        if parked == "cancel":
            raise TaskCancelled(self.task_id)
        if parked == "parked":
            logger.info("task %s: parked until answered", self.task_id, extra=self._fields("input_required", "parked"))
            raise parking.JobParked(self.task_id)
        # Answered between the window's end and the park: the answers are stored, read at once.
        return self._store.wait_for_answers(self.task_id, keys, 0)

    def once(self, key: str, fn: Callable[[], T]) -> T:
        """Run `fn()` the first time this task gets here, and return its (JSON-serialisable) result.

        The result is stored with the task: when the job runs again (resumed after it parked at a
        question, or redelivered after its worker was lost), `once` returns it without calling `fn`.
        Code before a question that is not inside `once` runs again then, and so does `fn` after a run
        cut short inside it (nothing stored). Detached (not started through MCP), `fn()` is just called.

        Raises:
            TypeError: the result cannot be stored as JSON.
        """
        if self._record is None:
            return fn()
        stored = self._store.memo(self.task_id, key)
        if stored is not None:
            return cast(T, json.loads(stored))
        value = fn()
        self._asked = True  # the task owns a memo hash now, to expire with its record
        return cast(T, json.loads(self._store.remember(self.task_id, key, json.dumps(value))))

    @property
    def log_fields(self) -> dict[str, str]:
        """The task fields every log line of this job carries (`mcp_celery.worker.logsetup`); {} detached."""
        return self._fields()

    def _fields(self, status: str | None = None, event: str | None = None) -> dict[str, str]:
        if self._record is None:
            return {}
        record = self._record
        return logs.task_fields(self.task_id, record.tool, principal=record.owner, status=status, event=event or status)

    def _store_celery_state(self, state: str, meta: dict[str, Any]) -> None:
        """What `update_state` does, without showing it in the record too (the record tells it already)."""
        self._task.backend.store_result(self.task_id, meta, state, request=self._task.request)

    def _send_event(self, event: str, **fields: Any) -> None:
        # Flower learns of custom states only through events; a lost event must not fail the job.
        try:
            self._task.send_event(event, **fields)
        except Exception:  # noqa: BLE001
            logger.warning("could not send the %s event for task %s", event, self.task_id, exc_info=True)
