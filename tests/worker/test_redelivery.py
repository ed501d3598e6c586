"""At-least-once tools (`retry_on_worker_loss=True`) survive lost workers; lost messages end honestly.

Real prefork workers, killed by process group (the whole worker) or from inside a job (one pool
process), and a server of this module's own. The session's settings (shared by every server, as
replicas must share them) look for the message of a task not started 3 s after its creation
(MCP_CELERY_QUEUE_CHECK_S) and give workers a 6 s heartbeat deadline, so every server looks for
overdue tasks every 2 s.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery.server.engine.reaper import LOST_BEFORE_START
from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, caps, start_http_server, start_worker, wait_for

LOST_TIMEOUT_S = 6.0
QUEUE_CHECK_S = 3.0
WAITING_AGAIN = "the worker was lost; waiting to run the job again"
REDIS_BROKER = os.environ["TEST_BROKER_URL"].startswith("redis")
ELICIT = caps(elicitation={})


@pytest.fixture(scope="module")
def server_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    assert env["MCP_CELERY_QUEUE_CHECK_S"] == str(int(QUEUE_CHECK_S))  # the session's, shared by every server
    url, server = start_http_server(env, logs / "redelivery.log")
    yield url
    server.stop()


@pytest.fixture
def client(server_url: str) -> Iterator[HttpClient]:
    c = HttpClient(server_url)
    yield c
    c.close()


@pytest.fixture
def doomed(env: dict[str, str], worker: Process, tmp_path: Path) -> Iterator[Process]:
    """A worker of its own for the `doomed` queue, which the test kills."""
    proc = start_worker(env, tmp_path / "doomed.log", queues="doomed", name=f"doomed-{uuid.uuid4().hex[:8]}")
    yield proc
    proc.stop()


@pytest.fixture
def replacement(env: dict[str, str], tmp_path: Path) -> Iterator[list[Process]]:
    """Workers a test starts after killing one; stopped at the end."""
    started: list[Process] = []
    yield started
    for proc in started:
        proc.stop()


def start_replacement(env: dict[str, str], tmp_path: Path, started: list[Process], concurrency: int = 4) -> Process:
    name = f"again-{uuid.uuid4().hex[:8]}"
    proc = start_worker(env, tmp_path / f"{name}.log", queues="doomed", name=name, concurrency=concurrency)
    started.append(proc)
    return proc


def unacked_of(broker: redis.Redis, *task_ids: str) -> int:
    """How many of kombu's unacked deliveries carry these tasks' messages (not another test's: a worker
    stopped right after its job ended can leave its late ack undone, on a loaded machine)."""
    marks = [f'"id": "{task_id}"'.encode() for task_id in task_ids]
    return sum(1 for value in broker.hvals("unacked") if any(mark in value for mark in marks))


def text_of(task: dict[str, Any]) -> str:
    return str(task["result"]["content"][0]["text"])


@pytest.mark.broker
def test_an_at_least_once_job_whose_whole_worker_is_killed_runs_again_while_an_at_most_once_one_fails(
    client: HttpClient,
    store_redis: redis.Redis,
    doomed: Process,
    env: dict[str, str],
    tmp_path: Path,
    replacement: list[Process],
) -> None:
    again, once = f"again-{uuid.uuid4()}", f"once-{uuid.uuid4()}"
    retried = client.start("doomed_retry_loop", {"seconds": 3, "marker": again})
    failed = client.start("doomed_loop", {"seconds": 3, "marker": once})
    wait_for(lambda: store_redis.get(again) == b"1" and store_redis.get(once) == b"1", 20, what="both jobs to start")
    os.killpg(doomed.pid, signal.SIGKILL)  # parent and pool at once: no Celery code runs after this
    killed = time.monotonic()

    # No worker consumes the queue now: the at-least-once task waits to run again, never failed.
    waiting = wait_for(
        lambda: t if (t := client.get(retried))["statusMessage"] == WAITING_AGAIN else None,
        LOST_TIMEOUT_S + 10,
        what="the at-least-once task to wait for a new run",
    )
    assert waiting["status"] == "working", waiting
    assert client.wait(failed, timeout=LOST_TIMEOUT_S + 10)["status"] == "failed"
    if REDIS_BROKER:
        # The server moved the message from kombu's unacked hash back to its queue, long before the
        # visibility timeout (12 h here) would have.
        broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])
        wait_for(lambda: broker.llen("doomed") == 1, LOST_TIMEOUT_S + 10, what="the message back in its queue")
        assert time.monotonic() - killed < LOST_TIMEOUT_S + 8

    start_replacement(env, tmp_path, replacement)
    done = client.wait(retried, timeout=40)
    assert done["status"] == "completed" and text_of(done) == "survived runs=2", done
    assert store_redis.get(again) == b"2"
    # At-most-once: the new worker never ran the lost job again, and the task stays failed.
    assert store_redis.get(once) == b"1"
    task = client.get(failed)
    assert task["status"] == "failed" and "worker running the job was lost" in task["statusMessage"], task


@pytest.mark.broker
def test_an_at_least_once_job_whose_pool_process_is_killed_runs_again(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    """Celery itself puts the message back (late ack, reject on worker lost); the plain `die` fails."""
    m = f"die-once-{uuid.uuid4()}"
    retried = client.start("die_once", {"marker": m})
    plain = client.start("die")
    done = client.wait(retried, timeout=40)
    assert done["status"] == "completed" and text_of(done) == "runs=2", done
    assert store_redis.get(m) == b"2"
    failed = client.wait(plain, timeout=40)
    assert failed["status"] == "failed" and "worker running the job was lost" in failed["statusMessage"], failed


@pytest.mark.broker
def test_a_job_that_kills_its_worker_every_time_ends_failed_after_its_allowed_runs(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    m = f"always-dies-{uuid.uuid4()}"
    task_id = client.start("always_dies", {"marker": m})
    failed = client.wait(task_id, timeout=60)
    assert failed["status"] == "failed" and failed["error"]["code"] == -32603, failed
    assert "lost its worker 3 times; it is not run again" in failed["statusMessage"], failed
    assert store_redis.get(m) == b"3"  # the first run and the two allowed again; the fourth start refused


@pytest.mark.broker
def test_answers_given_before_the_worker_was_lost_are_replayed_to_the_new_run(
    client: HttpClient,
    store_redis: redis.Redis,
    doomed: Process,
    env: dict[str, str],
    tmp_path: Path,
    replacement: list[Process],
) -> None:
    m = f"rounds-{uuid.uuid4()}"
    task_id = client.start("doomed_two_rounds", {"marker": m}, elicitation={})

    def asking(count_runs: int) -> dict[str, Any] | None:
        task = client.get(task_id, capabilities=ELICIT)
        assert task["status"] not in {"completed", "failed", "cancelled"}, task
        ok = task["status"] == "input_required" and store_redis.get(m) == str(count_runs).encode()
        return task if ok else None

    first = wait_for(lambda: asking(1), 20, 0.05, "the first question")
    (first_key,) = first["inputRequests"]
    client.result("tasks/update", {"taskId": task_id, "inputResponses": {first_key: ann()}}, capabilities=ELICIT)
    second = wait_for(
        lambda: t if (t := asking(1)) and first_key not in t["inputRequests"] else None, 20, 0.05, "the second question"
    )
    (second_key,) = second["inputRequests"]

    os.killpg(doomed.pid, signal.SIGKILL)
    lost = wait_for(
        lambda: t if (t := client.get(task_id, capabilities=ELICIT))["statusMessage"] == WAITING_AGAIN else None,
        LOST_TIMEOUT_S + 10,
        what="the task to wait for a new run",
    )
    assert lost["status"] == "working", lost
    start_replacement(env, tmp_path, replacement)

    # The new run replays the first answer (it is never asked again) and waits on the second question.
    def rerun_asks_second() -> dict[str, Any] | None:
        task = asking(2)
        assert task is None or set(task["inputRequests"]) == {second_key}, task
        return task

    rerun = wait_for(rerun_asks_second, 40, 0.05, "the new run to ask the second question")
    assert rerun["inputRequests"][second_key] == second["inputRequests"][second_key]
    bob = {"action": "accept", "content": {"name": "Bob"}}
    client.result("tasks/update", {"taskId": task_id, "inputResponses": {second_key: bob}}, capabilities=ELICIT)
    done = client.wait(task_id, timeout=20)
    assert done["status"] == "completed" and text_of(done) == "Ann,Bob,runs=2", done


@pytest.mark.skipif(not REDIS_BROKER, reason="kombu's unacked hash is the Redis transport's")
def test_a_lost_runs_message_taken_again_by_a_worker_that_died_before_starting_it_is_put_back_again(
    client: HttpClient,
    store_redis: redis.Redis,
    doomed: Process,
    env: dict[str, str],
    tmp_path: Path,
    replacement: list[Process],
) -> None:
    """The message of a lost run goes back to its queue; a consumer takes it and dies before the
    new run starts. Its delivery is later than the lost run's heartbeat, yet it is lost all the same."""
    again = f"again-{uuid.uuid4()}"
    retried = client.start("doomed_retry_loop", {"seconds": 3, "marker": again})
    wait_for(lambda: store_redis.get(again) == b"1", 20, what="the job to start")
    os.killpg(doomed.pid, signal.SIGKILL)
    broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])
    wait_for(lambda: broker.llen("doomed") == 1, 2 * LOST_TIMEOUT_S + 10, what="the message back in its queue")

    with sample_jobs.app.connection_for_read() as connection:
        channel: Any = connection.default_channel
        assert channel.basic_get("doomed", no_ack=False) is not None
        channel.qos._delivered.clear()  # a dead consumer restores nothing
    assert broker.llen("doomed") == 0 and unacked_of(broker, retried) == 1
    waiting = client.get(retried)
    assert waiting["status"] == "working" and waiting["statusMessage"] == WAITING_AGAIN, waiting

    start_replacement(env, tmp_path, replacement)
    done = client.wait(retried, timeout=2 * LOST_TIMEOUT_S + QUEUE_CHECK_S + 20)
    assert done["status"] == "completed" and text_of(done) == "survived runs=2", done
    assert store_redis.get(again) == b"2"


def ann() -> dict[str, Any]:
    return {"action": "accept", "content": {"name": "Ann"}}


@pytest.mark.skipif(not REDIS_BROKER, reason="only a Redis broker's queues can be looked into")
def test_a_lost_message_ends_failed_while_a_task_queued_behind_a_busy_worker_waits(
    client: HttpClient, store_redis: redis.Redis, env: dict[str, str], tmp_path: Path, replacement: list[Process]
) -> None:
    broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])
    start_replacement(env, tmp_path, replacement, concurrency=1)
    busy, lost, queued = (f"{what}-{uuid.uuid4()}" for what in ("busy", "lost", "queued"))
    busy_id = client.start("doomed_loop", {"seconds": 15, "marker": busy})
    wait_for(lambda: store_redis.get(busy) == b"1", 20, what="the busy job to start")
    lost_id = client.start("doomed_loop", {"seconds": 0, "marker": lost})
    queued_id = client.start("doomed_loop", {"seconds": 0, "marker": queued})
    wait_for(lambda: broker.llen("doomed") == 2, 10, what="both messages queued behind the busy job")

    # What a worker killed right after its BRPOP returned leaves: the message popped, and nowhere else.
    popped = broker.rpop("doomed")
    assert popped is not None and f'"id": "{lost_id}"'.encode() in popped
    popped_at = time.monotonic()

    failed = client.wait(lost_id, timeout=QUEUE_CHECK_S + 4 * LOST_TIMEOUT_S / 3 + 10)
    assert failed["status"] == "failed" and failed["statusMessage"] == LOST_BEFORE_START, failed
    assert failed["error"]["code"] == -32603
    assert time.monotonic() - popped_at < QUEUE_CHECK_S + 4 * LOST_TIMEOUT_S / 3 + 6
    # Queued for longer than the check threshold too, but its message is in the queue: untouched.
    waiting = client.get(queued_id)
    assert waiting["status"] == "working", waiting
    assert client.wait(busy_id, timeout=30)["status"] == "completed"
    done = client.wait(queued_id, timeout=20)
    assert done["status"] == "completed", done
    assert store_redis.get(lost) is None  # it never ran


@pytest.mark.skipif(not REDIS_BROKER, reason="kombu's unacked hash is the Redis transport's")
def test_a_message_taken_by_a_worker_that_died_before_starting_it_runs_at_least_once_or_not(
    client: HttpClient, store_redis: redis.Redis, env: dict[str, str], tmp_path: Path, replacement: list[Process]
) -> None:
    """A consumer takes both messages and dies: kombu would keep them in its unacked hash for 12 h.

    Each goes back to its queue once it has been held unstarted longer than the heartbeat timeout,
    the at-most-once one too: it never started, and only one delivery can ever start a job.
    """
    again, once = f"again-{uuid.uuid4()}", f"once-{uuid.uuid4()}"
    retried = client.start("doomed_retry_loop", {"seconds": 0, "marker": again})
    held = client.start("doomed_loop", {"seconds": 0, "marker": once})
    with sample_jobs.app.connection_for_read() as connection:
        channel: Any = connection.default_channel
        for _ in range(2):
            assert channel.basic_get("doomed", no_ack=False) is not None
        channel.qos._delivered.clear()  # a dead consumer restores nothing
    broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])
    assert unacked_of(broker, retried, held) == 2 and broker.llen("doomed") == 0

    start_replacement(env, tmp_path, replacement)
    done = client.wait(retried, timeout=LOST_TIMEOUT_S + QUEUE_CHECK_S + 20)
    assert done["status"] == "completed" and text_of(done) == "survived runs=1", done
    ran = client.wait(held, timeout=LOST_TIMEOUT_S + QUEUE_CHECK_S + 20)
    assert ran["status"] == "completed" and text_of(ran) == "survived", ran
    assert store_redis.get(once) == b"1"  # it ran, once
    # A late ack follows the stored result: the parent process acks once its pool process reports back.
    wait_for(lambda: unacked_of(broker, retried, held) == 0, 10, what="both deliveries to be acked")
