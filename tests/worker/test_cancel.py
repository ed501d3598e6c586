"""Cancellation on a real prefork worker (items 27-30). Celery's revoke alone does not reach
prefork children and is lost on restart; these tests pass only through the Redis flag."""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import redis

from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, start_worker, wait_for


def marker() -> str:
    return f"marker-{uuid.uuid4()}"


def iso_to_ms(stamp: str) -> int:
    return round(datetime.fromisoformat(stamp).timestamp() * 1000)


def celery_state(store: redis.Redis, task_id: str) -> dict[str, object]:
    """What Celery's own result backend (Redis or a database) holds for the task, read afresh."""
    return dict(sample_jobs.app.backend.get_task_meta(task_id, cache=False))


@pytest.mark.result_backend
def test_cancel_acks_empty_and_a_running_job_ends_cancelled_at_its_next_checkpoint(
    patient_client: HttpClient, store_redis: redis.Redis
) -> None:
    """On the server whose grace no wait here reaches (conftest.PATIENT_GRACE_S), `cancelled` can only
    come from the job stopping itself; how soon it stops is a goal of `python -m bench` (the cancel phase)."""
    client = patient_client
    m = marker()
    task_id = client.start("checkpoint_loop", {"seconds": 60, "marker": m})
    wait_for(lambda: store_redis.get(m), 15, what="the job to start")
    ack = client.result("tasks/cancel", {"taskId": task_id})
    assert ack == {"resultType": "complete", "_meta": ack["_meta"]}  # item 27: no task fields
    task = client.wait(task_id, timeout=30)  # a job that ignored the cancel would run on for 60 s
    assert task["status"] == "cancelled" and "grace" not in task.get("statusMessage", ""), task
    assert celery_state(store_redis, task_id)["status"] == "REVOKED"  # stopped at a checkpoint, by itself


def test_cancelling_a_terminal_task_is_an_idempotent_ack_that_changes_nothing(client: HttpClient) -> None:  # 28
    task_id = client.start("echo", {"text": "done"})
    before = client.wait(task_id)
    for _ in range(2):
        assert client.result("tasks/cancel", {"taskId": task_id})["resultType"] == "complete"
    after = client.get(task_id)
    assert after["status"] == "completed" and after["result"] == before["result"]


@pytest.mark.broker
@pytest.mark.result_backend
def test_a_task_cancelled_before_it_starts_never_runs_its_body(
    client: HttpClient, store_redis: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    m = marker()
    task_id = client.start("queued_elsewhere", {"marker": m})  # queue "later": no worker yet
    client.result("tasks/cancel", {"taskId": task_id})
    # No worker was online to receive the revoke broadcast, so Celery's own revoke is lost:
    # only the flag in Redis can stop the body.
    later = start_worker(env, tmp_path / "later.log", queues="later", name=f"later-{os.getpid()}")
    try:
        wait_for(lambda: celery_state(store_redis, task_id).get("status") == "REVOKED", 30, what="REVOKED")
    finally:
        later.stop()
    assert store_redis.get(m) is None
    assert client.get(task_id)["status"] == "cancelled"


@pytest.mark.result_backend
def test_a_job_without_checkpoints_is_reported_cancelled_after_the_grace_and_its_result_discarded(
    client: HttpClient, store_redis: redis.Redis, env: dict[str, str]
) -> None:
    grace_ms = int(float(env["MCP_CELERY_CANCEL_GRACE_S"]) * 1000)
    m = marker()
    task_id = client.start("stubborn", {"seconds": 3, "marker": m})
    client.wait(task_id, {"working"})
    wait_for(lambda: client.get(task_id).get("statusMessage") == "running", 15, what="the job to start")
    asked_ms = int(time.time() * 1000)
    client.result("tasks/cancel", {"taskId": task_id})
    acked_ms = int(time.time() * 1000) + 1  # the server stamped the cancel between asked_ms and acked_ms
    reads: list[tuple[int, int, dict[str, object]]] = []

    def read_until_cancelled() -> dict[str, object] | None:
        before = int(time.time() * 1000)
        task = client.get(task_id)
        reads.append((before, int(time.time() * 1000) + 1, task))
        return task if task["status"] == "cancelled" else None

    task = wait_for(read_until_cancelled, 10, 0.02, "the task to read cancelled")
    # Each read is judged by when it was made, so a slow machine only changes which reads are checked:
    # one answered before the grace can have run out says working, one begun after it did says cancelled.
    for before, after, seen in reads:
        if after < asked_ms + grace_ms:
            assert (seen["status"], seen.get("statusMessage")) == ("working", "cancelling"), seen
        if before > acked_ms + grace_ms:
            assert seen["status"] == "cancelled", seen
    # And the task turned cancelled when the grace ran out, not when the cancel came.
    assert asked_ms + grace_ms <= iso_to_ms(str(task["lastUpdatedAt"])) <= acked_ms + grace_ms, (task, asked_ms)
    wait_for(lambda: celery_state(store_redis, task_id).get("status") == "SUCCESS", 15, what="the late result")
    assert store_redis.get(m) == b"finished"
    late = client.get(task_id)
    assert late["status"] == "cancelled" and "result" not in late


@pytest.mark.broker
@pytest.mark.result_backend
def test_a_tool_that_opts_in_is_terminated_when_it_ignores_the_cancel(
    client: HttpClient, store_redis: redis.Redis, worker: Process
) -> None:
    m = marker()
    task_id = client.start("stubborn_terminable", {"seconds": 20, "marker": m})
    wait_for(lambda: store_redis.get(m), 15, what="the job to start")
    client.result("tasks/cancel", {"taskId": task_id})
    wait_for(lambda: celery_state(store_redis, task_id).get("status") == "REVOKED", 15, what="terminate")
    assert "terminated" in str(celery_state(store_redis, task_id)["result"])
    assert client.get(task_id)["status"] == "cancelled"
    assert store_redis.get(m) == b"started"  # it never finished
    assert worker.alive()
