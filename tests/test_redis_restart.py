"""Redis restarted under a running server and worker: nothing is lost and work resumes by itself.

A private redis-server with append-only persistence, on a port of its own, carries the broker,
the results and the task records of a prefork worker and an HTTP server started for this test.
A job is waiting for an answer when Redis is stopped (SIGTERM, so it writes its append-only file)
and started again on the same port and folder.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_celery._processes import wait_for
from tests.support import HttpClient, PersistentRedis, caps, start_http_server, start_worker


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[PersistentRedis]:
    server = PersistentRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker_log(tmp_path: Path) -> Path:
    return tmp_path / "worker.log"


@pytest.fixture
def stack(env: dict[str, str], redis_aof: PersistentRedis, worker_log: Path, tmp_path: Path) -> Iterator[HttpClient]:
    own = {**env, "TEST_BROKER_URL": f"{redis_aof.url}/0", "TEST_RESULT_BACKEND": f"{redis_aof.url}/1"}
    worker = start_worker(own, worker_log, name=f"restart-{redis_aof.port}")
    url, server = start_http_server(own, tmp_path / "server.log")
    client = HttpClient(url)
    yield client
    client.close()
    server.stop()
    worker.stop()


def test_a_redis_restart_loses_no_task_and_a_waiting_job_goes_on_after_it(
    stack: HttpClient, redis_aof: PersistentRedis
) -> None:
    task_id = stack.start("ask_one", {"timeout": 120}, elicitation={})
    asked = stack.wait(task_id, {"input_required"}, timeout=30)
    done_before = stack.start("echo", {"text": "before"})
    assert stack.wait(done_before)["status"] == "completed"

    redis_aof.stop()
    started = time.monotonic()
    reply = stack.post("tasks/get", {"taskId": task_id})
    assert time.monotonic() - started < 10  # no hang
    assert reply.status_code < 500, reply.text  # a JSON-RPC error, not a crash
    error = reply.json()["error"]
    assert error["code"] == -32603 and "Traceback" not in error["message"], error

    redis_aof.start()
    # Servers and workers reconnect by themselves; the record, the question and the result are all there.
    again = wait_for(lambda: "result" in (r := stack.call("tasks/get", {"taskId": task_id})) and r, 30, 0.2)["result"]
    assert again["status"] == "input_required" and again["inputRequests"] == asked["inputRequests"]
    assert stack.get(done_before)["result"]["content"][0]["text"] == "before"

    (key,) = asked["inputRequests"]
    answer = {"action": "accept", "content": {"confirm": True}}
    stack.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}, capabilities=caps())
    done = stack.wait(task_id, timeout=60)  # the job waited through the outage and now goes on
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "published", done
    after = stack.start("echo", {"text": "after"})  # and new work runs
    assert stack.wait(after, timeout=60)["result"]["content"][0]["text"] == "after"


@pytest.mark.parametrize("tool", ["nap", "steady"])
def test_a_job_that_runs_and_ends_while_redis_is_down_completes_once_redis_is_back(
    tool: str, stack: HttpClient, redis_aof: PersistentRedis, tmp_path: Path
) -> None:
    """`nap` only sleeps; `steady` reports progress and checks for cancel all through the outage."""
    flag = tmp_path / f"{tool}-returning"
    task_id = stack.start(tool, {"seconds": 1.5, "flag_file": str(flag)})
    wait_for(lambda: stack.get(task_id).get("statusMessage") not in {None, "queued"}, 30, 0.02, "the job to start")
    redis_aof.stop()
    wait_for(flag.exists, 30, 0.05, "the job to return while Redis is down")
    redis_aof.start()
    wait_for(lambda: "result" in stack.call("tasks/get", {"taskId": task_id}), 60, 0.2, "the server to reconnect")
    done = stack.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["content"][0]["text"].startswith(("rested", "steady after")), done


def test_a_job_starting_while_redis_is_down_waits_for_it_instead_of_failing(
    stack: HttpClient, redis_aof: PersistentRedis, tmp_path: Path, worker_log: Path
) -> None:
    """Celery stores STARTED before the job runs; Redis gone in that instant must not fail the task.

    Seen in the chaos test: the store raised ConnectionError, the task ended with it as its
    error, and the message Celery could not ack ran again and succeeded unseen. Celery's backend
    now retries its writes through an outage (`result_backend_always_retry`).
    """
    hold = tmp_path / "hold"
    task_id = stack.start("held_start", {"hold_file": str(hold)})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the job to be held just before it starts")
    redis_aof.stop()
    hold.write_text("go")
    attempts = ("Retrying", "Exception raised outside body", "raised unexpected")  # the fixed and the old way
    wait_for(
        lambda: any(attempt in worker_log.read_text() for attempt in attempts),
        30,
        0.05,
        "Celery to try storing STARTED while Redis is down",
    )
    redis_aof.start()
    wait_for(lambda: "result" in stack.call("tasks/get", {"taskId": task_id}), 60, 0.2, "the server to reconnect")
    done = stack.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["content"][0]["text"] == "started after the hold", done
