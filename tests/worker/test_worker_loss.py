"""A worker killed whole (parent and pool, SIGKILL) with a job on it: the task ends `failed`.

Real prefork workers, killed by process group. The session's settings give workers a 6 s
heartbeat deadline (MCP_CELERY_WORKER_LOST_TIMEOUT_S): the job's process beats every 2 s (and
the main process for a job it has taken but not started), and every server process looks for
overdue tasks every 2 s.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mcp_celery.server.engine.reaper import LOST_BEFORE_START
from mcp_celery.store.schema import FIELD, Keys
from tests.support.harness import HttpClient, Process, start_worker, wait_for

LOST_TIMEOUT_S = 6.0
QUEUE_CHECK_S = 3.0  # MCP_CELERY_QUEUE_CHECK_S of the session (tests/conftest.py)
REDIS_BROKER = os.environ["TEST_BROKER_URL"].startswith("redis")


@pytest.fixture
def doomed(env: dict[str, str], worker: Process, tmp_path: Path) -> Iterator[Process]:
    """A worker of its own for the `doomed` queue, which the test kills."""
    proc = start_worker(env, tmp_path / "doomed.log", queues="doomed", name=f"doomed-{uuid.uuid4().hex[:8]}")
    yield proc
    proc.stop()


@pytest.mark.broker
def test_a_job_whose_whole_worker_is_killed_ends_failed_and_listeners_hear_it(
    client: HttpClient, store_redis: redis.Redis, doomed: Process, env: dict[str, str], tmp_path: Path
) -> None:
    marker = f"runs-{uuid.uuid4()}"
    task_id = client.start("doomed_loop", {"seconds": 120, "marker": marker})
    wait_for(lambda: store_redis.get(marker) == b"1", 20, what="the job to start")
    stream = client.stream("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
    ack = stream.next()
    assert ack is not None and ack["params"]["notifications"]["taskIds"] == [task_id]
    os.killpg(doomed.pid, signal.SIGKILL)  # parent and pool at once: no Celery code runs after this
    killed = time.monotonic()
    last = None
    while (message := stream.next(timeout=30)) is not None and message.get("id") != stream.request_id:
        last = message["params"]
    stream.close()
    detected = time.monotonic() - killed
    assert last is not None and last["status"] == "failed", last
    assert last["error"]["code"] == -32603 and "worker running the job was lost" in last["statusMessage"]
    assert detected < LOST_TIMEOUT_S + 6, detected  # the deadline plus a reaping period or two
    task = client.get(task_id)
    assert task["status"] == "failed" and task["error"] == last["error"]

    # At-most-once by default: a new worker on the queue never runs the lost job a second time.
    again = start_worker(env, tmp_path / "after.log", queues="doomed", name=f"after-{uuid.uuid4().hex[:8]}")
    try:
        probe = f"probe-{uuid.uuid4()}"
        probe_id = client.start("doomed_loop", {"seconds": 0, "marker": probe})
        assert client.wait(probe_id, timeout=30)["status"] == "completed"  # the new worker consumes the queue
    finally:
        again.stop()
    assert store_redis.get(marker) == b"1"
    assert client.get(task_id)["status"] == "failed"  # frozen: nothing changes it any more


@pytest.mark.broker
def test_a_worker_killed_after_taking_a_job_before_starting_it_ends_the_task_failed_and_it_never_runs(
    client: HttpClient, store_redis: redis.Redis, doomed: Process, env: dict[str, str], tmp_path: Path
) -> None:
    """The moment between Celery's early ack and the job's start, held open (task_prerun).

    The broker no longer has the message and no job heartbeat has begun; with RabbitMQ nothing was
    left to look into, and the task stayed `working` for ever. The worker's main process marks the
    task taken before the ack and beats the mark until the job starts, so its loss is seen too.
    """
    hold = tmp_path / "hold"
    task_id = client.start("doomed_held_start", {"hold_file": str(hold)})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the pool process to hold the job before its start")
    # The pool process tells the main process it took the job as it begins, so the main process
    # marks the task (and acks at once after) a little later: wait for the mark.
    record = Keys().task(task_id)
    wait_for(lambda: store_redis.hexists(record, FIELD.TAKEN), 30, 0.02, "the worker to mark the message taken")
    held = client.get(task_id)
    assert held["status"] == "working" and held["statusMessage"] == "queued", held  # as before the mark
    os.killpg(doomed.pid, signal.SIGKILL)  # parent and pool at once: no Celery code runs after this
    killed = time.monotonic()
    hold.write_text("go")  # nothing may run the job now; if anything did, it would not wait here

    ended = wait_for(
        lambda: (task := client.get(task_id))["status"] != "working" and task,
        LOST_TIMEOUT_S + 15,
        0.1,
        "the task to end",
    )
    detected = time.monotonic() - killed
    assert ended["status"] == "failed", ended
    assert ended["error"]["code"] == -32603, ended
    assert "the worker that took the job's message was lost before the job started" in ended["statusMessage"], ended
    assert detected < LOST_TIMEOUT_S + 6, detected  # the deadline plus a period or two

    # At most once: a new worker on the queue consumes it, and the job never runs.
    again = start_worker(env, tmp_path / "after.log", queues="doomed", name=f"after-{uuid.uuid4().hex[:8]}")
    try:
        probe = f"probe-{uuid.uuid4()}"
        probe_id = client.start("doomed_loop", {"seconds": 0, "marker": probe})
        assert client.wait(probe_id, timeout=30)["status"] == "completed"
    finally:
        again.stop()
    assert not Path(f"{hold}.ran").exists()
    final = client.get(task_id)  # frozen: nothing changes it any more
    assert final["status"] == "failed" and final["statusMessage"] == ended["statusMessage"], final


@pytest.mark.skipif(not REDIS_BROKER, reason="only a Redis broker's queues can be looked into")
def test_a_worker_killed_between_the_ack_and_the_taken_mark_leaves_a_task_that_ends_failed(
    client: HttpClient, store_redis: redis.Redis, doomed: Process
) -> None:
    """With a Redis broker the `taken` mark waits a moment for the job to start (most jobs do, and
    cost no command for it): a worker lost in that moment leaves no mark, no message and no
    heartbeat, and the servers' looks for the message (nowhere, twice) end the task `failed`."""
    hold = Path(os.environ.get("TMPDIR", "/tmp")) / f"hold-{uuid.uuid4()}"
    task_id = client.start("doomed_held_start", {"hold_file": str(hold)})
    broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])

    def acked() -> bool:
        queued = any(task_id.encode() in m for m in broker.lrange("doomed", 0, -1))
        return not queued and not any(task_id.encode() in v for v in broker.hvals("unacked"))

    wait_for(acked, 30, 0.01, "the worker to take and ack the message")
    os.killpg(doomed.pid, signal.SIGSTOP)  # the main process (and its TakenBeat thread) stops here
    marked = store_redis.hexists(Keys().task(task_id), FIELD.TAKEN)  # rarely: a very slow poll above
    os.killpg(doomed.pid, signal.SIGKILL)
    ended = client.wait(task_id, timeout=QUEUE_CHECK_S + 2 * LOST_TIMEOUT_S + 15)
    assert ended["status"] == "failed" and ended["error"]["code"] == -32603, ended
    expected = "the worker that took the job's message was lost" if marked else LOST_BEFORE_START
    assert expected in ended["statusMessage"], (marked, ended)
    assert not Path(f"{hold}.ran").exists()
