"""Task record → the MCP task status. The only place Celery states are compared.

Pure: no celery or redis import. The worker side writes the job's state into the record in the
shape of Celery's result meta (`record.job`: progress while it runs, then its outcome), so this
table holds whatever Celery's own result backend is.

| Celery state (the record's job meta)          | MCP status                                   |
|-----------------------------------------------|----------------------------------------------|
| no meta, PENDING, RECEIVED, STARTED, RETRY,   | working (input_required while the record     |
| PROGRESS or any custom state, INPUT_REQUIRED  | holds outstanding input requests)            |
| SUCCESS                                       | completed, the return value as CallToolResult|
| FAILURE: mcp_celery.ProtocolError             | failed, with that JSON-RPC error             |
| FAILURE: worker lost, time limit, terminated  | failed, -32603, statusMessage says why       |
| running, heartbeat ran out (worker killed)    | failed, -32603 (working again if redelivered;|
|                                               | cancelled if a cancel was waiting)           |
| message taken, `taken` ran out before start   | failed, -32603 (cancelled if a cancel waited)|
| FAILURE: any other exception                  | completed, isError: true                     |
| REVOKED                                       | cancelled                                    |

A cancel request that the job has not honoured within the grace period reads as
cancelled, and a result the job produced after that is discarded. Once a terminal
state has been frozen into the record it is returned as it is, for ever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from mcp_celery.core.approvals import approval_of
from mcp_celery.errors import jsonrpc_error, protocol_error_of
from mcp_celery.protocol import (
    INTERNAL_ERROR,
    QUEUED_MESSAGE,
    TERMINAL_STATUSES,
    TOOL_ERROR_PREFIX,
    TaskStatus,
    call_tool_result,
    detailed_task,
    iso_ms,
    now_ms,
)
from mcp_celery.redact import redact
from mcp_celery.store.artifacts import ArtifactMeta
from mcp_celery.store.ended import EndedEntry
from mcp_celery.store.schema import TaskRecord

__all__ = [
    "CANCELLED_BEFORE_START",
    "CANCELLED_WHILE_PARKED",
    "CELERY_TO_MCP_STATUS",
    "Found",
    "INFRASTRUCTURE_FAILURES",
    "LOST_AFTER_TAKEN",
    "LOST_HEARTBEAT",
    "PARKED_TIMEOUT",
    "READY_STATES",
    "WAITING_TO_RUN_AGAIN",
    "TaskView",
    "ended_entry",
    "ended_without_job",
    "expired",
    "lost_entry",
    "reported_ttl_ms",
    "task_view",
]

CELERY_TO_MCP_STATUS: dict[str, TaskStatus] = {
    "SUCCESS": "completed",
    "FAILURE": "failed",  # refined by _failure(): most exceptions are tool errors
    "REVOKED": "cancelled",
}
#: Celery states after which a job never runs again.
READY_STATES = frozenset(CELERY_TO_MCP_STATUS)
#: The statusMessage of a task cancelled before its job started (its job never runs).
CANCELLED_BEFORE_START = "cancelled before the job started"
#: Cancelled while the job was parked at an open question (`mcp_celery.worker.parking`): it never runs again.
CANCELLED_WHILE_PARKED = "cancelled while the job was parked, waiting for an answer"
#: A parked job's question timed out (no worker waits to raise InputTimeout in the job).
PARKED_TIMEOUT = "no answer to the parked job's question within its input timeout (MCP_CELERY_INPUT_TIMEOUT_S)"
#: A worker took the job's message (acked it early) and was lost before the job started.
LOST_AFTER_TAKEN = "the worker that took the job's message was lost before the job started"
#: A running job's heartbeat ran out (its worker killed whole, its machine lost); `{since}` is when.
LOST_HEARTBEAT = "the worker running the job was lost: no heartbeat since {since}"
#: The same for a `retry_on_worker_loss` tool, whose message goes back to its queue.
WAITING_TO_RUN_AGAIN = "the worker was lost; waiting to run the job again"

_WORKING_MESSAGES = {
    "PENDING": QUEUED_MESSAGE,
    "RECEIVED": "queued on a worker",
    "STARTED": "running",
    "RETRY": "waiting to retry",
    "INPUT_REQUIRED": "resuming with the answers",
}

#: Failures of the execution itself rather than of the tool's logic: JSON-RPC errors (-32603), by exception name.
INFRASTRUCTURE_FAILURES = {
    "WorkerLostError": "the worker running the job was lost",
    "TimeLimitExceeded": "the job exceeded its time limit",
    "SoftTimeLimitExceeded": "the job exceeded its soft time limit",
    "Terminated": "the job was terminated",
    "WorkerTerminate": "the worker was terminated",
    "WorkerShutdown": "the worker shut down",
}


@dataclass(frozen=True)
class TaskView:
    """An MCP task status at one moment, without the record's fixed fields."""

    status: TaskStatus
    updated_ms: int
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    #: Failed because its worker was lost (not frozen: only the ended stream hears of it).
    lost: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_json(self) -> str:
        return json.dumps(
            {
                "status": self.status,
                "updated": self.updated_ms,
                "message": self.status_message,
                "result": self.result,
                "error": self.error,
            }
        )

    @classmethod
    def from_frozen(cls, frozen: dict[str, Any]) -> TaskView:
        return cls(
            status=frozen["status"],
            updated_ms=frozen["updated"],
            status_message=frozen.get("message"),
            result=frozen.get("result"),
            error=frozen.get("error"),
        )

    def detailed_task(self, record: TaskRecord, now_ms: int) -> dict[str, Any]:
        """The wire `DetailedTask` (without `resultType`) for `tasks/get` and notifications."""
        return detailed_task(
            task_id=record.task_id,
            status=self.status,
            created_ms=record.created_ms,
            updated_ms=self.updated_ms,
            ttl_ms=reported_ttl_ms(record, self, now_ms),
            poll_ms=record.poll_ms,
            status_message=self.status_message,
            input_requests=self.input_requests,
            result=self.result,
            error=self.error,
        )


#: A task as just read: its record and its MCP view.
Found = tuple[TaskRecord, TaskView]


def reported_ttl_ms(record: TaskRecord, view: TaskView, now_ms: int) -> int | None:
    """TTL counted from creation, as the spec has it, extended so that a live task never expires.

    A running or waiting task is kept TTL past now; a finished one is kept TTL past its end.
    """
    if record.ttl_ms is None:
        return None
    anchor = view.updated_ms if view.terminal else now_ms
    return max(anchor - record.created_ms, 0) + record.ttl_ms


def expired(record: TaskRecord, view: TaskView, now_ms: int) -> bool:
    return view.terminal and record.ttl_ms is not None and now_ms > view.updated_ms + record.ttl_ms


def task_view(
    record: TaskRecord,
    now_ms: int,
    *,
    structured: bool,
    grace_ms: int,
    debug: bool = False,
    redelivered_on_loss: bool = False,
) -> TaskView:
    """The MCP view of a task from its record.

    `structured`: the tool declares an output schema, so a result carries structuredContent.
    `redelivered_on_loss`: the tool's message goes back to the queue when its worker is lost
    (late ack, reject on worker loss), so a lost heartbeat means "waiting to run again".
    """
    if record.final is not None:
        return TaskView.from_frozen(record.final)
    meta = record.job
    state = str(meta.get("status")) if meta else "PENDING"
    cancel_deadline = None if record.cancel_ms is None else record.cancel_ms + grace_ms
    if state in CELERY_TO_MCP_STATUS:
        done_ms = _date_done_ms(meta) or now_ms
        if cancel_deadline is not None and done_ms > cancel_deadline and state != "REVOKED":
            return _cancelled_late(cancel_deadline)
        return _terminal(state, meta or {}, done_ms, record, structured, debug)
    if cancel_deadline is not None and now_ms >= cancel_deadline:
        return _cancelled_late(cancel_deadline)
    if record.alive_until_ms is not None and now_ms > record.alive_until_ms:
        if record.cancel_ms is not None:
            # Stopped while a cancel waited: most often the server terminating it when the grace ran
            # out (its timer can fire a few ms before this reader's deadline); the user asked for this end.
            return _stopped_while_cancelling(record.alive_until_ms)
        if not redelivered_on_loss:
            return _worker_lost(record.alive_until_ms, record.lost_reason)
        return TaskView("working", record.alive_until_ms, WAITING_TO_RUN_AGAIN)
    if record.alive_until_ms is None and record.taken_until_ms is not None and now_ms > record.taken_until_ms:
        # Only at-most-once jobs are marked taken: the message was acked, so nothing runs it now.
        if record.cancel_ms is not None:
            return _stopped_while_cancelling(record.taken_until_ms)
        return _lost_after_taken(record.taken_until_ms)
    updated = record.updated_ms or record.created_ms
    if record.inputs and record.cancel_ms is None:
        return TaskView("input_required", updated, _waiting_message(record.inputs), input_requests=record.inputs)
    message = "cancelling" if record.cancel_ms is not None else _progress_message(state, meta)
    return TaskView("working", updated, message)


def _waiting_message(inputs: dict[str, Any]) -> str:
    """An approval's link is in the statusMessage too, for clients without URL elicitation and plain hosts."""
    for request in inputs.values():
        if isinstance(request, dict) and approval_of(request) is not None:
            return f"waiting for approval: {request['params']['message']} (decide at {request['params']['url']})"
    return "waiting for input"


def _worker_lost(at_ms: int, reason: str | None = None) -> TaskView:
    # A worker that shut down said why before its job stopped; otherwise it died without a word.
    message = reason or LOST_HEARTBEAT.format(since=iso_ms(at_ms))
    return TaskView("failed", at_ms, message, error={"code": INTERNAL_ERROR, "message": message}, lost=True)


def _lost_after_taken(at_ms: int) -> TaskView:
    message = f"{LOST_AFTER_TAKEN}: no sign of it since {iso_ms(at_ms)}"
    return TaskView("failed", at_ms, message, error={"code": INTERNAL_ERROR, "message": message}, lost=True)


def ended_entry(
    task_id: str, tool: str, meta: dict[str, Any], *, created_ms: int, started_ms: int | None, input_ms: int = 0
) -> EndedEntry:
    """The ended stream's entry for a job that ends with Celery result `meta` (`mcp_celery.store.ended`).

    The status is the one the task will read (a tool's exception: completed, a tool error); a
    pool process lost under the job (Celery's WorkerLostError) counts as a lost worker.
    """
    state = str(meta.get("status"))
    done_ms = _date_done_ms(meta) or now_ms()
    exc = meta.get("result") if isinstance(meta.get("result"), dict) else {}
    lost = state == "FAILURE" and isinstance(exc, dict) and exc.get("exc_type") == "WorkerLostError"
    if state in ("SUCCESS", "REVOKED"):
        status: TaskStatus = CELERY_TO_MCP_STATUS[state]
        reason = "" if state == "SUCCESS" else _exception_text(meta.get("result"))
        tool_error = False
    else:
        view = _failure(meta, done_ms, tool, debug=False)
        status, tool_error = view.status, view.status == "completed"
        reason = view.status_message or (view.result or {}).get("content", [{}])[0].get("text", "")
    return EndedEntry(
        task_id,
        tool,
        status,
        created_ms,
        done_ms,
        started_ms,
        input_ms,
        tool_error=tool_error,
        lost=lost,
        reason=reason,
    )


def lost_entry(record: TaskRecord, view: TaskView) -> EndedEntry:
    """The ended stream's entry for a task that a reader found lost with its worker (`TaskView.lost`)."""
    return ended_without_job(record, view, lost=True)


def ended_without_job(record: TaskRecord, view: TaskView, *, lost: bool = False) -> EndedEntry:
    """The ended stream's entry for a task a server ended while no job ran (lost, a parked question timed out)."""
    reason = view.status_message or ""
    return EndedEntry(
        record.task_id, record.tool, view.status, record.created_ms, view.updated_ms, lost=lost, reason=reason
    )


def _cancelled_late(at_ms: int) -> TaskView:
    return TaskView("cancelled", at_ms, "cancelled; the job did not stop within the grace period")


def _stopped_while_cancelling(at_ms: int) -> TaskView:
    return TaskView("cancelled", at_ms, "cancelled; the job's process was stopped before the job ended")


def _terminal(
    state: str, meta: dict[str, Any], done_ms: int, record: TaskRecord, structured: bool, debug: bool
) -> TaskView:
    if state == "SUCCESS":
        result = call_tool_result(meta.get("result"), structured=structured)
        return TaskView("completed", done_ms, result=with_artifacts(result, record))
    if state == "REVOKED":
        return TaskView("cancelled", done_ms, _exception_text(meta.get("result")) or "cancelled")
    view = _failure(meta, done_ms, record.tool, debug)
    return view if view.result is None else replace(view, result=with_artifacts(view.result, record))


def with_artifacts(result: dict[str, Any], record: TaskRecord) -> dict[str, Any]:
    """`result` with a `resource_link` block for each of the task's artifacts after the job's own content."""
    if not record.artifacts:
        return result
    links = [ArtifactMeta.from_json(name, meta).link(record.task_id) for name, meta in record.artifacts.items()]
    return {**result, "content": [*result.get("content", []), *links]}


def _failure(meta: dict[str, Any], done_ms: int, tool: str, debug: bool) -> TaskView:
    exc = meta.get("result") if isinstance(meta.get("result"), dict) else {}
    assert isinstance(exc, dict)
    exc_type = str(exc.get("exc_type", "Exception"))
    raised = protocol_error_of(exc)
    if raised is not None:
        code, message, data = jsonrpc_error(raised)
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        return TaskView("failed", done_ms, message, error=error)
    if exc_type in INFRASTRUCTURE_FAILURES:
        detail = _exception_text(exc)
        message = INFRASTRUCTURE_FAILURES[exc_type] + (f": {detail}" if detail else "")
        return TaskView("failed", done_ms, message, error={"code": INTERNAL_ERROR, "message": message})
    text = f"{TOOL_ERROR_PREFIX} {tool}: {exc_type}: {_exception_text(exc)}".rstrip(": ")
    if debug and meta.get("traceback"):
        text += "\n" + redact(str(meta["traceback"]))
    result = {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": True}
    return TaskView("completed", done_ms, result=result)


def _exception_text(exc: Any) -> str:
    # A job's exception can quote a connection URL with its password: never pass that on.
    if not isinstance(exc, dict):
        return "" if exc is None else redact(str(exc))
    args = exc.get("exc_message")
    if isinstance(args, list | tuple):
        return redact(", ".join(str(a) for a in args))
    return "" if args is None else redact(str(args))


def _progress_message(state: str, meta: dict[str, Any] | None) -> str:
    """statusMessage for a working task; PROGRESS-style meta from update_state() is shown as is."""
    if state in _WORKING_MESSAGES:
        return _WORKING_MESSAGES[state]
    info = meta.get("result") if meta else None
    if isinstance(info, dict) and info:
        for key in ("message", "status", "statusMessage", "msg"):
            if isinstance(info.get(key), str):
                return str(info[key])
        if "current" in info and "total" in info:
            return f"{info['current']}/{info['total']}"
        return json.dumps(info, default=str)
    return _WORKING_MESSAGES.get(state, state.lower())


def _date_done_ms(meta: dict[str, Any] | None) -> int | None:
    raw = meta.get("date_done") if meta else None
    if not raw:
        return None
    try:
        parsed = datetime.fromisoformat(str(raw))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        # Celery writes naive UTC when enable_utc is on (the default).
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)
