"""The Celery-state-to-MCP-status table, without I/O (checklist items 15, 17, 34).

The worker writes the job's state into the record in the shape of Celery's result meta:
`progress` while it runs, `outcome` once it ended; `view(meta)` puts `meta` where it belongs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from mcp_celery.core.status import READY_STATES, TaskView, expired, reported_ttl_ms, task_view
from mcp_celery.store.schema import TaskRecord

T0 = 1_700_000_000_000
HOUR = 3_600_000


def record(**kw: Any) -> TaskRecord:
    return TaskRecord(**{"task_id": "t1", "tool": "echo", "created_ms": T0, "ttl_ms": HOUR, "poll_ms": 1000, **kw})


def view(meta: dict[str, Any] | None, rec: TaskRecord | None = None, now: int = T0 + 1000, **kw: Any) -> TaskView:
    ended = meta is not None and meta.get("status") in READY_STATES
    rec = replace(rec or record(), outcome=meta if ended else None, progress=None if ended else meta)
    return task_view(rec, now, structured=False, grace_ms=5000, **kw)


def failure(exc_type: str, *args: Any) -> dict[str, Any]:
    return {
        "status": "FAILURE",
        "result": {"exc_type": exc_type, "exc_message": list(args), "exc_module": "builtins"},
        "traceback": "Traceback (most recent call last):\n  ...secret internals...",
        "date_done": "2023-11-14T22:13:25.000000",
    }


def test_queued_started_retrying_and_custom_progress_are_working() -> None:
    for state in ("PENDING", "RECEIVED", "STARTED", "RETRY", "PROGRESS"):
        assert view({"status": state, "result": None}).status == "working"
    assert view(None).status == "working"


def test_celery_style_progress_meta_becomes_the_status_message() -> None:
    assert view({"status": "PROGRESS", "result": {"current": 3, "total": 10}}).status_message == "3/10"
    assert view({"status": "PROGRESS", "result": {"message": "step 2"}}).status_message == "step 2"
    assert view({"status": "STARTED", "result": {"pid": 1, "hostname": "w"}}).status_message == "running"


def test_success_is_completed_with_the_result_inline_marked_complete() -> None:
    v = view({"status": "SUCCESS", "result": "hi", "date_done": "2023-11-14T22:13:25+00:00"})
    assert v.status == "completed"
    assert v.result == {"resultType": "complete", "content": [{"type": "text", "text": "hi"}], "isError": False}
    assert v.updated_ms == 1_700_000_005_000


def test_a_raising_job_is_a_tool_error_without_traceback() -> None:
    v = view(failure("ValueError", "kaboom"))
    assert v.status == "completed"
    assert v.result is not None and v.result["isError"] is True
    text = v.result["content"][0]["text"]
    assert "ValueError" in text and "kaboom" in text and "Traceback" not in text


def test_debug_setting_adds_the_traceback() -> None:
    v = view(failure("ValueError", "kaboom"), debug=True)
    assert v.result is not None and "Traceback" in v.result["content"][0]["text"]


def test_protocol_error_is_failed_with_its_code_message_and_data() -> None:
    v = view(failure("ProtocolError", -32602, "bad thing", {"why": "x"}))
    assert v.status == "failed"
    assert v.error == {"code": -32602, "message": "bad thing", "data": {"why": "x"}}
    assert v.result is None and v.status_message == "bad thing"


def test_worker_lost_and_time_limits_are_failed_internal_errors_with_a_status_message() -> None:
    for exc_type in ("WorkerLostError", "TimeLimitExceeded"):
        v = view(failure(exc_type, "signal 9"))
        assert v.status == "failed"
        assert v.error is not None and v.error["code"] == -32603
        assert v.status_message and "signal 9" in v.status_message


def test_a_job_stopped_by_its_worker_shutting_down_says_so_unless_it_finished() -> None:
    reason = "the worker shut down before the job finished (shutdown grace period 25 s)"
    rec = record(alive_until_ms=T0 + 500, lost_reason=reason)
    assert view({"status": "STARTED"}, record(lost_reason=reason, alive_until_ms=T0 + 5000)).status == "working"
    stopped = view({"status": "STARTED"}, rec)  # running when its process was stopped
    assert stopped.status == "failed" and stopped.status_message == reason
    assert stopped.error == {"code": -32603, "message": reason}
    done = {"status": "SUCCESS", "result": "x", "date_done": "2023-11-14T22:13:25.000000"}
    assert view(done, rec).status == "completed"  # a result stored before the stop wins


def test_revoked_is_cancelled() -> None:
    meta = {"status": "REVOKED", "result": {"exc_type": "TaskRevokedError", "exc_message": ["cancelled by client"]}}
    v = view(meta)
    assert v.status == "cancelled" and v.status_message == "cancelled by client"


def test_outstanding_inputs_make_a_live_task_input_required() -> None:
    requests = {"q-1": {"method": "elicitation/create", "params": {}}}
    v = view({"status": "INPUT_REQUIRED", "result": {}}, record(inputs=requests))
    assert v.status == "input_required" and v.input_requests == requests
    # Answered (no outstanding inputs) but the job has not woken yet: working again.
    assert view({"status": "INPUT_REQUIRED", "result": {}}).status == "working"


def test_a_cancel_not_honoured_within_the_grace_period_reads_cancelled_and_a_late_result_is_discarded() -> None:
    rec = record(cancel_ms=T0 + 1000)
    assert view({"status": "STARTED"}, rec, now=T0 + 2000).status == "working"
    assert view({"status": "STARTED"}, rec, now=T0 + 6000).status == "cancelled"
    late = {"status": "SUCCESS", "result": "x", "date_done": "2099-01-01T00:00:00+00:00"}
    assert view(late, rec, now=T0 + 9000).status == "cancelled"


def test_a_job_whose_process_is_stopped_while_a_cancel_waits_reads_cancelled_not_lost() -> None:
    """A cancelled job that opted in to termination: the server kills its process when the grace runs
    out (by its own timer), the job's process ends its heartbeat at once, and the REVOKED outcome follows
    a moment later. A read in between, a few ms before this server's own deadline, took the ended
    heartbeat for a lost worker and froze `failed` (seen once in CI, under RabbitMQ)."""
    interrupted = record(cancel_ms=T0 + 1000, alive_until_ms=T0 + 5990)  # deadline T0 + 6000 (grace 5 s)
    seen = view({"status": "STARTED"}, interrupted, now=T0 + 5995)
    assert (seen.status, seen.error) == ("cancelled", None), seen
    taken = record(cancel_ms=T0 + 1000, taken_until_ms=T0 + 5990)  # acked, never started, cancel waiting
    assert view(None, taken, now=T0 + 5995).status == "cancelled"
    # Without a cancel, a stopped heartbeat is still a lost worker.
    assert view({"status": "STARTED"}, record(alive_until_ms=T0 + 5990), now=T0 + 5995).status == "failed"


def test_a_frozen_terminal_state_never_changes() -> None:
    frozen = TaskView("failed", T0 + 5, "boom", error={"code": -32603, "message": "boom"})
    rec = record(final=json.loads(frozen.to_json()))
    assert view({"status": "SUCCESS", "result": "later"}, rec) == frozen


def test_ttl_grows_while_the_task_lives_and_counts_from_the_end_once_finished() -> None:
    rec = record()
    working = TaskView("working", T0)
    assert reported_ttl_ms(rec, working, T0 + 10 * HOUR) == 11 * HOUR
    done = TaskView("completed", T0 + 2 * HOUR)
    assert reported_ttl_ms(rec, done, T0 + 10 * HOUR) == 3 * HOUR
    assert not expired(rec, done, T0 + 3 * HOUR)
    assert expired(rec, done, T0 + 3 * HOUR + 1)
    assert not expired(rec, working, T0 + 100 * HOUR)
    assert reported_ttl_ms(record(ttl_ms=None), done, T0) is None


def test_detailed_task_has_the_per_status_field_and_rfc3339_timestamps() -> None:
    rec = record()
    completed = view({"status": "SUCCESS", "result": 1}).detailed_task(rec, T0 + 1000)
    assert set(completed) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs", "result"}
    assert completed["createdAt"].endswith("+00:00")
    failed = view(failure("ProtocolError", -1, "x")).detailed_task(rec, T0 + 1000)
    assert "error" in failed and "result" not in failed
    working = view({"status": "STARTED"}).detailed_task(rec, T0 + 1000)
    assert not {"result", "error", "inputRequests", "requestState"} & set(working)


def test_a_taken_message_reads_queued_until_its_mark_runs_out_then_failed() -> None:
    taken = record(taken_until_ms=T0 + 6000)
    before = view(None, taken, now=T0 + 5000)
    assert before.status == "working" and before.status_message == "queued"
    lost = view(None, taken, now=T0 + 7000)
    assert lost.status == "failed" and lost.error is not None and lost.error["code"] == -32603
    assert lost.status_message is not None
    assert lost.status_message.startswith("the worker that took the job's message was lost before the job started")
    # Once the job started, its own heartbeat decides; the mark is gone then anyway.
    started = record(taken_until_ms=T0 + 6000, alive_until_ms=T0 + 12000)
    assert view({"status": "STARTED"}, started, now=T0 + 7000).status == "working"
