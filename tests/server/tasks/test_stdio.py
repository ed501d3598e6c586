"""The same server over stdio, in raw newline-delimited JSON-RPC: modern and legacy clients."""

from __future__ import annotations

import time

import pytest

from tests.support import sample_jobs
from tests.support.harness import TERMINAL, StdioClient, caps, wait_for


def wait_terminal(stdio: StdioClient, task_id: str, timeout: float = 15) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        task = stdio.request("tasks/get", {"taskId": task_id})["result"]
        if task["status"] in TERMINAL:
            return dict(task)
        assert time.monotonic() < deadline, task
        time.sleep(0.05)


def job_running(stdio: StdioClient, task_id: str) -> bool:
    """Whether the `checkpoint_loop` job has reported a step (it is running, past its first checkpoint)."""
    task = stdio.request("tasks/get", {"taskId": task_id})["result"]
    return str(task.get("statusMessage", "")).startswith("step ")


@pytest.mark.broker
def test_stdio_serves_tasks_to_declaring_clients(stdio: StdioClient) -> None:
    discover = stdio.request("server/discover", capabilities={})["result"]
    assert "io.modelcontextprotocol/tasks" in discover["capabilities"]["extensions"]
    created = stdio.request("tools/call", {"name": "echo", "arguments": {"text": "over stdio"}})["result"]
    assert created["resultType"] == "task"
    task = wait_terminal(stdio, created["taskId"])
    assert task["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": "over stdio"}],
        "isError": False,
    }


@pytest.mark.broker
def test_stdio_cancel_and_sync_and_gating(patient_stdio: StdioClient) -> None:
    """The cancel stops a running job: with a grace no wait here reaches (conftest.PATIENT_GRACE_S),
    only the job itself can end the task `cancelled`."""
    stdio = patient_stdio
    created = stdio.request("tools/call", {"name": "checkpoint_loop", "arguments": {"seconds": 60}})["result"]
    task_id = created["taskId"]
    wait_for(lambda: job_running(stdio, task_id), 30, what="the job to reach its first checkpoint")
    assert stdio.request("tasks/cancel", {"taskId": task_id})["result"]["resultType"] == "complete"
    cancelled = wait_terminal(stdio, task_id, timeout=30)  # a job that ignored the cancel would run on for 60 s
    assert cancelled["status"] == "cancelled" and "grace" not in str(cancelled.get("statusMessage")), cancelled
    assert sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"] == "REVOKED"  # stopped by itself
    sync = stdio.request("tools/call", {"name": "echo", "arguments": {"text": "s"}}, capabilities={})["result"]
    assert sync["content"][0]["text"] == "s" and "taskId" not in sync
    gated = stdio.request("tasks/get", {"taskId": task_id}, capabilities=caps(declare=False))
    assert gated["error"]["code"] == -32021


def test_clients_of_the_initialize_era_get_synchronous_results(stdio: StdioClient) -> None:
    init = stdio.request(
        "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}},
        modern=False,
    )
    assert init["result"]["protocolVersion"] == "2025-11-25"
    stdio.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    reply = stdio.request("tools/call", {"name": "echo", "arguments": {"text": "old"}}, modern=False)
    assert reply["result"]["content"] == [{"type": "text", "text": "old"}]
    # A legacy `task` param is ignored too, and tasks/* needs the (modern) declaration.
    legacy = stdio.request(
        "tools/call", {"name": "echo", "arguments": {"text": "x"}, "task": {"ttl": 1000}}, modern=False
    )
    assert legacy["result"]["content"][0]["text"] == "x"
    assert stdio.request("tasks/get", {"taskId": "x"}, modern=False)["error"]["code"] == -32021
    required = stdio.request("tools/call", {"name": "required_job", "arguments": {"text": "x"}}, modern=False)
    assert required["error"]["code"] == -32021
