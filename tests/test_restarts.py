"""Restarts lose nothing: every task lives in Redis, not in a server's or a worker's memory."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
import redis

from tests.support import HttpClient, Process, start_http_server, start_worker, wait_for


def test_a_server_killed_mid_task_leaves_every_task_readable_answerable_and_cancellable(
    env: dict[str, str], worker: Process, tmp_path: Path
) -> None:
    url, first = start_http_server(env, tmp_path / "first.log")
    before = HttpClient(url)
    asking = before.start("ask_one", {"timeout": 60}, elicitation={})
    asked = before.wait(asking, {"input_required"}, timeout=30)
    running = before.start("checkpoint_loop", {"seconds": 60})
    before.wait(running, {"working"})
    before.close()
    first.kill(signal.SIGKILL)  # no shutdown code runs

    url, second = start_http_server(env, tmp_path / "second.log")
    after = HttpClient(url)
    try:
        again = after.get(asking)
        assert again["status"] == "input_required" and again["inputRequests"] == asked["inputRequests"]
        (key,) = again["inputRequests"]
        answer = {"action": "accept", "content": {"confirm": True}}
        after.result("tasks/update", {"taskId": asking, "inputResponses": {key: answer}})
        assert after.wait(asking, timeout=30)["result"]["content"][0]["text"] == "published"
        after.result("tasks/cancel", {"taskId": running})
        assert after.wait(running, timeout=30)["status"] == "cancelled"
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
    assert client.get(queued)["status"] == "working"
    restarted = start_worker(env, tmp_path / "after.log", queues="doomed", name=name)
    try:
        assert client.wait(queued, timeout=30)["result"]["content"][0]["text"] == "survived"
        wait_for(lambda: client.get(dropped)["status"] == "cancelled", 30, what="the cancel to hold")
    finally:
        restarted.stop()
    assert store_redis.get(runs) == b"1" and store_redis.get(cancelled) is None  # the cancelled body never ran
