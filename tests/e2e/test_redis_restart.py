"""Redis restarted under a running server and worker: nothing is lost and work resumes by itself.

A private redis-server with append-only persistence, on a port of its own, carries the broker,
the results and the task records of a prefork worker and an HTTP server started for this test.
A job is waiting for an answer when Redis is stopped (SIGTERM, so it writes its append-only file)
and started again on the same port and folder.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mcp_celery.testing.processes import wait_for
from tests.support import sample_jobs
from tests.support.harness import HttpClient, PersistentRedis, caps, start_http_server, start_worker


@pytest.fixture
def worker_log(tmp_path: Path) -> Path:
    return tmp_path / "worker.log"


@pytest.fixture
def stack(env: dict[str, str], own_redis: PersistentRedis, worker_log: Path, tmp_path: Path) -> Iterator[HttpClient]:
    own = {**env, "TEST_BROKER_URL": f"{own_redis.url}/0", "TEST_RESULT_BACKEND": f"{own_redis.url}/1"}
    worker = start_worker(own, worker_log, name=f"restart-{own_redis.port}")
    url, server = start_http_server(own, tmp_path / "server.log")
    client = HttpClient(url)
    yield client
    client.close()
    server.stop()
    worker.stop()


def test_a_redis_restart_loses_no_task_and_a_waiting_job_goes_on_after_it(
    stack: HttpClient, own_redis: PersistentRedis
) -> None:
    task_id = stack.start("ask_one", {"timeout": 120}, elicitation={})
    asked = stack.wait(task_id, {"input_required"}, timeout=30)
    done_before = stack.start("echo", {"text": "before"})
    assert stack.wait(done_before)["status"] == "completed"

    own_redis.stop()
    started = time.monotonic()
    reply = stack.post("tasks/get", {"taskId": task_id})
    assert time.monotonic() - started < 10  # no hang
    assert reply.status_code < 500, reply.text  # a JSON-RPC error, not a crash
    error = reply.json()["error"]
    assert error["code"] == -32603 and "Traceback" not in error["message"], error

    own_redis.start()
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
    tool: str, stack: HttpClient, own_redis: PersistentRedis, tmp_path: Path
) -> None:
    """`nap` only sleeps; `steady` reports progress and checks for cancel all through the outage."""
    flag = tmp_path / f"{tool}-returning"
    task_id = stack.start(tool, {"seconds": 1.5, "flag_file": str(flag)})
    wait_for(lambda: stack.get(task_id).get("statusMessage") not in {None, "queued"}, 30, 0.02, "the job to start")
    own_redis.stop()
    wait_for(flag.exists, 30, 0.05, "the job to return while Redis is down")
    own_redis.start()
    wait_for(lambda: "result" in stack.call("tasks/get", {"taskId": task_id}), 60, 0.2, "the server to reconnect")
    done = stack.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["content"][0]["text"].startswith(("rested", "steady after")), done


def test_a_job_starting_while_redis_is_down_waits_for_it_instead_of_failing(
    stack: HttpClient, own_redis: PersistentRedis, tmp_path: Path, worker_log: Path
) -> None:
    """The job's start (JOB_START, and Celery's own writes) with Redis gone must not fail the task.

    Seen in the chaos test: the store raised ConnectionError, the task ended with it as its
    error, and the message Celery could not ack ran again and succeeded unseen. The job's start
    now waits for Redis, and Celery's backend retries its writes (`result_backend_always_retry`).
    """
    hold = tmp_path / "hold"
    task_id = stack.start("held_start", {"hold_file": str(hold)})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the job to be held just before it starts")
    own_redis.stop()
    hold.write_text("go")
    # The job's start waits for Redis (and Celery's own writes retry); the old way failed the task.
    attempts = ("Redis unreachable as the job starts", "Retrying", "Exception raised outside body", "raised unexpected")
    wait_for(
        lambda: any(attempt in worker_log.read_text() for attempt in attempts),
        30,
        0.05,
        "Celery to try storing STARTED while Redis is down",
    )
    own_redis.start()
    wait_for(lambda: "result" in stack.call("tasks/get", {"taskId": task_id}), 60, 0.2, "the server to reconnect")
    done = stack.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["content"][0]["text"] == "started after the hold", done


@pytest.mark.parametrize("inside", [True, False], ids=["storing", "looking-up"])
def test_ctx_once_waits_for_a_restarting_redis_instead_of_failing_the_job(
    inside: bool, stack: HttpClient, own_redis: PersistentRedis, tmp_path: Path, worker_log: Path
) -> None:
    """`ctx.once` with Redis away as it stores its value (`storing`) or looks for one (`looking-up`).

    Seen in the chaos test (parking jobs wrap their work in `ctx.once`): Redis restarting as the
    value was stored ended the task failed with BusyLoadingError, its work done. Now the job waits
    for Redis, as it does for its question and its outcome, and its work runs once.
    """
    hold = tmp_path / "hold"
    task_id = stack.start("held_once", {"hold_file": str(hold), "inside": inside})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the job to be held at its ctx.once")
    own_redis.stop()
    hold.write_text("go")
    # ctx.once retrying (or, as before, the job's failure waiting to be stored) while Redis is down.
    wait_for(lambda: "Redis unreachable" in worker_log.read_text(), 30, 0.05, "the job to try Redis")
    own_redis.start()
    wait_for(lambda: "result" in stack.call("tasks/get", {"taskId": task_id}), 60, 0.2, "the server to reconnect")
    done = stack.wait(task_id, timeout=60)
    assert done["status"] == "completed" and not done["result"].get("isError"), done
    assert done["result"]["content"][0]["text"] == "built once", done
    assert Path(f"{hold}.calls").read_text() == "called\n"  # its work ran once


def test_a_redis_that_hangs_does_not_stall_the_workers_main_loop(
    env: dict[str, str], tmp_path: Path, store_redis: redis.Redis
) -> None:
    """The worker's main process marks a job `taken` before its early ack: a Redis paused by SIGSTOP
    (it accepts connections and never answers) must cost that call its socket timeout, not the
    worker its main loop (acks, other jobs, control commands).

    mcp-celery's records live on a Redis of their own here, paused; the broker and Celery's results
    stay on the session's Redis, so the worker has everything else it needs.
    """
    broker = env["TEST_BROKER_URL"]
    if not broker.startswith("redis"):
        pytest.skip("the ack is observed in kombu's Redis unacked hash")  # CI's Redis pass runs it
    # The session's other tests leave tasks queued for ever on `later`: this worker would take those
    # messages first, and each would cost the paused Redis's socket timeout before ours (seen in CI).
    with redis.Redis.from_url(broker) as session_broker:
        if queued := session_broker.keys("later*"):
            session_broker.delete(*queued)
    records = PersistentRedis(tmp_path / "records")
    records.start()
    assert records.proc is not None
    own = {**env, "MCP_CELERY_REDIS_URL": f"{records.url}/0"}
    url, server = start_http_server(own, tmp_path / "server.log")
    client = HttpClient(url)
    name = f"hung-{records.port}@%h"
    worker = None
    paused = False
    try:
        marker = f"hung-{records.port}"
        task_id = client.start("queued_elsewhere", {"marker": marker})  # queue "later": no worker yet
        os.kill(records.proc.pid, signal.SIGSTOP)
        paused = True
        worker = start_worker(own, tmp_path / "worker.log", queues="later", name=name.split("@")[0])
        broker_redis = redis.Redis.from_url(broker)

        def acked() -> bool:
            """The message left its queue and kombu's unacked hash: a worker took it and acked it (after
            the main process's call to the paused Redis, which marks the task taken)."""
            queued = any(
                task_id.encode() in m for q in broker_redis.keys("later*") for m in broker_redis.lrange(q, 0, -1)
            )
            return not queued and not any(task_id.encode() in v for v in broker_redis.hvals("unacked"))

        try:
            wait_for(acked, 30, 0.05, "the worker to take and ack the message while Redis hangs")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the broker holds {_where(broker_redis, task_id)}") from None
        node = name.replace("%h", socket.gethostname())
        assert wait_for(lambda: sample_jobs.app.control.ping(destination=[node], timeout=1), 20, 0.1, "a ping reply")
        os.kill(records.proc.pid, signal.SIGCONT)
        paused = False
        done = client.wait(task_id, timeout=60)  # the job itself waited for Redis, and ran
        assert done["status"] == "completed", done
        assert store_redis.get(marker) == b"body ran"
    finally:
        if paused:
            os.kill(records.proc.pid, signal.SIGCONT)
        client.close()
        server.stop()
        if worker is not None:
            worker.stop()
        records.stop()


def _where(broker: redis.Redis, task_id: str) -> dict[str, object]:
    """Every copy of the task's message in the broker's queues and unacked hash (what a failed wait saw)."""
    queued = {
        q.decode(): sum(task_id.encode() in m for m in broker.lrange(q, 0, -1))
        for q in broker.keys("later*")
        if broker.type(q) == b"list"
    }
    unacked = {tag.decode(): body[:300] for tag, body in broker.hgetall("unacked").items() if task_id.encode() in body}
    delivered = broker.zrange("unacked_index", 0, -1, withscores=True)
    return {"queued": queued, "unacked": unacked, "unacked_index": delivered}
