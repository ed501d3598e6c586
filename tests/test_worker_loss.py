"""A worker killed whole (parent and pool, SIGKILL) with a job on it: the task ends `failed`.

Real prefork workers, killed by process group. The session's settings give workers a 6 s
heartbeat deadline (MCP_CELERY_WORKER_LOST_TIMEOUT_S): the job's process beats every 2 s, and
every server process looks for overdue tasks every 2 s.
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

from tests.support import HttpClient, Process, start_worker, wait_for

LOST_TIMEOUT_S = 6.0


@pytest.fixture
def doomed(env: dict[str, str], worker: Process, tmp_path: Path) -> Iterator[Process]:
    """A worker of its own for the `doomed` queue, which the test kills."""
    proc = start_worker(env, tmp_path / "doomed.log", queues="doomed", name=f"doomed-{uuid.uuid4().hex[:8]}")
    yield proc
    proc.stop()


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
