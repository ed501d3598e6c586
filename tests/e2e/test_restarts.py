"""Restarts lose nothing: every task lives in Redis, not in a server's or a worker's memory."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
import redis

from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, start_http_server, start_worker, wait_for


def celery_status(task_id: str) -> str:
    """The job's state in Celery's own result backend, read afresh."""
    return str(sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"])


def test_a_server_killed_mid_task_leaves_every_task_readable_answerable_and_cancellable(
    patient_env: dict[str, str], worker: Process, tmp_path: Path
) -> None:
    """Both servers have a cancel grace no wait here reaches (conftest.PATIENT_GRACE_S): the running job's
    task reads `cancelled` only once the job itself has stopped."""
    url, first = start_http_server(patient_env, tmp_path / "first.log")
    before = HttpClient(url)
    asking = before.start("ask_one", {"timeout": 60}, elicitation={})
    asked = before.wait(asking, {"input_required"}, timeout=30)
    running = before.start("checkpoint_loop", {"seconds": 60})
    wait_for(lambda: before.get(running).get("statusMessage", "").startswith("step "), 30, what="a first step")
    before.close()
    first.kill(signal.SIGKILL)  # no shutdown code runs

    url, second = start_http_server(patient_env, tmp_path / "second.log")
    after = HttpClient(url)
    try:
        again = after.get(asking)
        assert again["status"] == "input_required" and again["inputRequests"] == asked["inputRequests"]
        (key,) = again["inputRequests"]
        answer = {"action": "accept", "content": {"confirm": True}}
        after.result("tasks/update", {"taskId": asking, "inputResponses": {key: answer}})
        assert after.wait(asking, timeout=30)["result"]["content"][0]["text"] == "published"
        after.result("tasks/cancel", {"taskId": running})
        cancelled = after.wait(running, timeout=30)  # a job that ignored the cancel would run on for 60 s
        assert cancelled["status"] == "cancelled" and "grace" not in cancelled.get("statusMessage", ""), cancelled
        assert celery_status(running) == "REVOKED"  # the job stopped at a checkpoint, by itself
    finally:
        after.close()
        second.stop()


@pytest.mark.broker
def test_tasks_queued_while_no_worker_runs_run_after_a_restart_and_a_cancel_given_meanwhile_holds(
    env: dict[str, str], client: HttpClient, store_redis: redis.Redis, tmp_path: Path
) -> None:
    name = f"restarted-{uuid.uuid4().hex[:8]}"
    doomed = start_worker(env, tmp_path / "before.log", queues="doomed", name=name)
    doomed.stop()  # a graceful stop, with nothing running: the queue waits for the next worker
    runs, cancelled = f"runs-{uuid.uuid4()}", f"never-{uuid.uuid4()}"
    queued = client.start("doomed_loop", {"seconds": 0, "marker": runs})
    dropped = client.start("doomed_loop", {"seconds": 0, "marker": cancelled})
    client.result("tasks/cancel", {"taskId": dropped})  # no worker is online to hear Celery's revoke
    assert client.get(dropped)["status"] == "cancelled"  # unstarted: cancelled at once
    assert client.get(queued)["status"] == "working"
    restarted = start_worker(env, tmp_path / "after.log", queues="doomed", name=name)
    try:
        assert client.wait(queued, timeout=30)["result"]["content"][0]["text"] == "survived"
        # The restarted worker takes the cancelled job's message and, told only by the task's record in Redis,
        # drops it, storing Celery's REVOKED as it does: only then is "never ran" worth checking.
        wait_for(lambda: celery_status(dropped) == "REVOKED", 30, what="the worker to take and drop the message")
    finally:
        restarted.stop()
    assert store_redis.get(runs) == b"1" and store_redis.get(cancelled) is None  # the cancelled body never ran
    assert client.get(dropped)["status"] == "cancelled"  # and the cancel held
