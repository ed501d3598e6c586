"""A worker's SIGTERM: running jobs get MCP_CELERY_SHUTDOWN_GRACE_S to finish; the rest end failed at once.

Prefork workers of their own (queue `doomed`); the first has a 4 s grace and a 120 s heartbeat deadline, so
that only the shutdown path, not the lost-worker reaper, can end a task within the test's bounds.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any, cast

import redis

from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, start_worker, wait_for
from tests.support.push import listen, notifications_until_end

GRACE_S = 4.0


def test_sigterm_lets_a_short_job_finish_and_fails_a_long_one_saying_the_worker_shut_down(
    client: HttpClient, store_redis: redis.Redis, worker: Process, env: dict[str, str], tmp_path: Path
) -> None:
    own = {**env, "MCP_CELERY_SHUTDOWN_GRACE_S": str(GRACE_S), "MCP_CELERY_WORKER_LOST_TIMEOUT_S": "120"}
    proc = start_worker(own, tmp_path / "w.log", queues="doomed", name=f"sigterm-{uuid.uuid4().hex[:8]}", concurrency=2)
    try:
        short_marker, long_marker = f"short-{uuid.uuid4()}", f"long-{uuid.uuid4()}"
        short = client.start("doomed_loop", {"seconds": 2.5, "marker": short_marker})
        long = client.start("doomed_loop", {"seconds": 120, "marker": long_marker})
        wait_for(lambda: store_redis.get(short_marker) and store_redis.get(long_marker), 30, what="both jobs to start")
        stream, _ = listen(client, [long])
        os.kill(proc.pid, signal.SIGTERM)  # the parent only, as a process manager does
        stopped = time.monotonic()
        seen, _ = notifications_until_end(stream, timeout=GRACE_S + 30)
        stream.close()
        detected = time.monotonic() - stopped
        last = seen[-1]
        assert last["status"] == "failed", last
        assert "worker shut down before the job finished" in last["statusMessage"], last
        assert last["error"]["code"] == -32603
        assert GRACE_S - 0.5 < detected < GRACE_S + 8, detected  # after the grace, not a heartbeat period later
        done = client.wait(short, timeout=30)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "survived", done
        proc.proc.wait(timeout=30)  # and the worker exits
    finally:
        proc.stop()
    assert client.get(long)["status"] == "failed"
    assert store_redis.get(long_marker) == b"1" and store_redis.get(short_marker) == b"1"  # each ran once


def test_a_second_delivery_of_an_at_most_once_job_never_runs_it_again(
    client: HttpClient, store_redis: redis.Redis, worker: Process, env: dict[str, str], tmp_path: Path
) -> None:
    """A cold shutdown restores the message of a job whose start the worker had not yet acknowledged
    (the chaos test saw it run twice); any such second delivery is refused by the job runner."""
    proc = start_worker(env, tmp_path / "w.log", queues="doomed", name=f"again-{uuid.uuid4().hex[:8]}", concurrency=2)
    try:
        marker = f"again-{uuid.uuid4()}"
        task_id = client.start("doomed_loop", {"seconds": 0.1, "marker": marker})
        done = client.wait(task_id, timeout=30)
        assert done["status"] == "completed"
        cast(Any, sample_jobs.doomed_loop).apply_async(kwargs={"seconds": 0.1, "marker": marker}, task_id=task_id)
        wait_for(lambda: f"[{task_id}] ignored" in proc.output(), 30, what="the second delivery to be refused")
    finally:
        proc.stop()
    assert store_redis.get(marker) == b"1"  # the body ran once
    assert client.get(task_id) == done | {"ttlMs": client.get(task_id)["ttlMs"]}  # and the task is unchanged
