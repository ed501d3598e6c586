"""Cancelling a task whose job has not started: `cancelled` at once, and the job never runs.

A job waiting behind busy slots (in the broker, or already reserved by a worker), or taken by a worker
and not yet begun, is cancelled in the same step that records the cancel, atomically with the job's
start (the CANCEL and JOB_START scripts both run on the task's record). All on prefork workers, with
whichever broker the session uses (Redis, or RabbitMQ in CI's second pass).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mcp_celery.store.schema import FIELD, Keys
from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, start_worker, wait_for
from tests.support.push import listen, notifications_until_end

#: Slots of the backlog queue's worker: both held by blockers while the backlog is cancelled.
SLOTS = 2


@pytest.fixture(scope="module")
def backlog_worker(env: dict[str, str], worker: Process, logs: Path) -> Iterator[Process]:
    proc = start_worker(
        env, logs / "backlog-worker.log", queues="backlog", name=f"backlog-{os.getpid()}", concurrency=SLOTS
    )
    yield proc
    proc.stop()


def celery_state(task_id: str) -> str:
    return str(sample_jobs.app.backend.get_task_meta(task_id, cache=False).get("status"))


def hold_the_slots(client: HttpClient, store_redis: redis.Redis) -> tuple[str, list[str]]:
    """Start a blocker in every slot of the backlog worker; returns the release key and their ids."""
    release = f"release-{uuid.uuid4()}"
    started = [f"blocker-{uuid.uuid4()}" for _ in range(SLOTS)]
    ids = [client.start("backlog_blocker", {"release": release, "marker": m}) for m in started]
    wait_for(lambda: all(store_redis.get(m) for m in started), 30, what="every slot to hold a blocker")
    return release, ids


@pytest.mark.broker
@pytest.mark.result_backend
def test_fifty_jobs_behind_busy_slots_half_cancelled_at_random_those_end_at_once_and_never_run(
    client: HttpClient, store_redis: redis.Redis, backlog_worker: Process
) -> None:
    release, blockers = hold_the_slots(client, store_redis)
    runs = f"runs-{uuid.uuid4()}"
    queued = [client.start("backlog_job", {"runs": runs, "index": i}) for i in range(50)]
    chosen = sorted(random.Random(os.getpid()).sample(range(50), 25))
    stream, _ = listen(client, [queued[i] for i in chosen])
    try:
        for i in chosen:
            assert client.result("tasks/cancel", {"taskId": queued[i]})["resultType"] == "complete"
            # The very next read: cancelled in the same step that recorded the cancel, no grace.
            task = client.get(queued[i])
            assert task["status"] == "cancelled", task
            assert task["statusMessage"] == "cancelled before the job started", task
        pushed, _ = notifications_until_end(stream)
    finally:
        stream.close()
    # Each listener got the terminal notification (the stream ends once all its tasks are terminal).
    assert {t["taskId"] for t in pushed if t["status"] == "cancelled"} == {queued[i] for i in chosen}

    store_redis.set(release, "go", ex=600)
    for task_id in blockers:
        assert client.wait(task_id, timeout=30)["status"] == "completed"
    kept = [i for i in range(50) if i not in chosen]
    for i in kept:
        task = client.wait(queued[i], timeout=60)
        assert task["status"] == "completed" and task["result"]["content"][0]["text"] == f"job {i} ran", task
    # The worker has drained the queue: every kept job ran exactly once, no cancelled one ever did.
    wait_for(lambda: all(celery_state(queued[i]) == "REVOKED" for i in chosen), 30, what="revoked messages dropped")
    ran = {int(k): int(v) for k, v in store_redis.hgetall(runs).items()}
    assert ran == dict.fromkeys(kept, 1)
    for i in chosen:
        assert client.get(queued[i])["status"] == "cancelled"


@pytest.mark.broker
@pytest.mark.result_backend
def test_a_job_taken_by_a_worker_and_not_yet_begun_is_cancelled_at_once_and_never_runs(
    client: HttpClient, store_redis: redis.Redis, tmp_path: Path
) -> None:
    """The instant between Celery's early ack and the job's start, held open (task_prerun)."""
    hold = tmp_path / "hold"
    task_id = client.start("held_start", {"hold_file": str(hold)})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the pool process to hold the job before its start")
    client.result("tasks/cancel", {"taskId": task_id})
    task = client.get(task_id)
    assert task["status"] == "cancelled" and task["statusMessage"] == "cancelled before the job started", task
    hold.write_text("go")
    # The pool process goes on into the job's start, which finds the task ended and refuses it.
    wait_for(lambda: celery_state(task_id) == "REVOKED", 30, what="Celery's state REVOKED")
    assert not Path(f"{hold}.ran").exists()
    assert client.get(task_id)["status"] == "cancelled"


@pytest.mark.broker
@pytest.mark.result_backend
def test_a_terminable_tool_cancelled_before_it_starts_never_terminates_a_process(
    client: HttpClient, store_redis: redis.Redis, backlog_worker: Process, env: dict[str, str], logs: Path
) -> None:
    """The cancel of an unstarted job schedules no terminate: after the grace it would hit whatever the
    process runs then (here, the blockers that hold every slot)."""
    release, blockers = hold_the_slots(client, store_redis)
    runs = f"runs-{uuid.uuid4()}"
    task_id = client.start("backlog_terminable", {"runs": runs, "index": 0})
    client.result("tasks/cancel", {"taskId": task_id})
    assert client.get(task_id)["status"] == "cancelled"
    grace_s = float(env["MCP_CELERY_CANCEL_GRACE_S"])

    # Watch the blockers through the grace and past it: a terminate would end one of them.
    watch_until = time.monotonic() + grace_s + 2
    while time.monotonic() < watch_until:
        assert [client.get(b)["status"] for b in blockers] == ["working"] * SLOTS, "a blocker was stopped"
        time.sleep(0.1)
    store_redis.set(release, "go", ex=600)
    for blocker in blockers:
        assert client.wait(blocker, timeout=30)["status"] == "completed"
    wait_for(lambda: celery_state(task_id) == "REVOKED", 30, what="the revoked message dropped")
    assert not store_redis.hexists(runs, "0")
    assert backlog_worker.alive()
    # The server never decided to terminate anything for it (the session server's log).
    assert f"task {task_id} did not stop within the grace period" not in (logs / "http-server.log").read_text()


@pytest.mark.broker
def test_a_tool_with_its_own_request_class_is_watched_from_the_ack_too(
    client: HttpClient, store_redis: redis.Redis, tmp_path: Path
) -> None:
    """The worker marks the task taken before the early ack, and the tool's own class still does its part."""
    hold = tmp_path / "hold"
    task_id = client.start("own_request_held_start", {"hold_file": str(hold)})
    wait_for(Path(f"{hold}.reached").exists, 30, 0.02, "the pool process to hold the job before its start")
    record = Keys().task(task_id)
    wait_for(lambda: store_redis.hexists(record, FIELD.TAKEN), 30, 0.02, "the worker to mark the message taken")
    # The mark is written just before the tool's own `on_accepted` runs, in the same call: wait for its file too.
    accepted = Path(f"{hold}.accepted")
    wait_for(lambda: accepted.exists() and accepted.read_text(), 30, 0.02, "the tool's own request class")
    assert accepted.read_text() == "own request"
    hold.write_text("go")
    task = client.wait(task_id, timeout=30)
    assert task["status"] == "completed" and task["result"]["content"][0]["text"] == "started after the hold"
