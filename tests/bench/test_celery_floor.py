"""The celery floor (`bench/celery_floor_server.py`), the bound `python -m bench.bounds` measures ours
against, does the work it stands for; a floor that answered without running the job would make
any bound from it false.

One private Redis, a prefork worker of the bench's own app and the floor server as a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from bench import rpc
from bench.rpc import TASKS_EXT, SyncClient
from mcp_celery.testing.processes import start_redis
from tests.support.harness import Process, free_port, http_answers, start_worker, wait_for


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, redis.Redis, Process]]:
    logs: Path = tmp_path_factory.mktemp("celery-floor")
    redis_url, redis_proc = start_redis(logs / "redis.log")
    env = {"BENCH_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    procs: list[Process] = []
    try:
        worker = start_worker(env, logs / "worker.log", app="bench.bench_jobs", name="floor", concurrency=2)
        procs.append(worker)
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        server = Process([sys.executable, "-m", "bench.celery_floor_server", str(port)], env, logs / "server.log")
        procs.append(server)
        server.wait_ready(lambda: http_answers(url), 60, "the celery floor to answer")
        yield url, redis.Redis.from_url(f"{redis_url}/0"), worker
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis_proc.stop()


@pytest.fixture
def declared(floor: tuple[str, redis.Redis, Process]) -> Iterator[SyncClient]:
    """A client of the celery floor that declares the tasks extension."""
    client = SyncClient(floor[0], {"extensions": {TASKS_EXT: {}}})
    yield client
    client.close()


def stored_result(store: redis.Redis, task_id: str) -> dict[str, object]:
    """What Celery's Redis backend stored for `task_id` (the worker's own write)."""
    raw = store.get(f"celery-task-meta-{task_id}")
    assert raw is not None, f"Celery stored no result for {task_id}"
    return dict(json.loads(raw))


def test_a_plain_call_answers_the_result_the_job_returned(floor: tuple[str, redis.Redis, Process]) -> None:
    url, _, _ = floor
    client = SyncClient(url, {})
    try:
        for x in (7, 8):
            answer = client.result("tools/call", {"name": "raw_noop", "arguments": {"x": x}}, "raw_noop")
            # The STARTED state is published first: an answer taken from it would not be the job's result.
            assert answer["content"] == [{"type": "text", "text": str(x)}]
    finally:
        client.close()


def test_a_declared_call_queues_a_celery_job_that_tasks_get_then_reads_completed(
    floor: tuple[str, redis.Redis, Process], declared: SyncClient
) -> None:
    _, store, _ = floor
    task_id = declared.start("raw_noop", {"x": 41})
    deadline = time.monotonic() + 30
    while (status := declared.get(task_id)["status"]) != "completed":
        assert status == "working", status
        assert time.monotonic() < deadline, f"{task_id} still {status}"
        time.sleep(0.02)
    assert stored_result(store, task_id)["status"] == "SUCCESS"
    assert stored_result(store, task_id)["result"] == 41


def listen(url: str, task_ids: list[str], seen: list[dict[str, Any]]) -> None:
    """Append to `seen` the `notifications/tasks` params of one listen stream over `task_ids`, until its result."""
    headers, body = rpc.request("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, task_ids[0])
    with httpx.Client(timeout=60) as http, http.stream("POST", url, headers=headers, content=body) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("method") == "notifications/tasks":
                    seen.append(message["params"])
                elif "result" in message or "error" in message:
                    assert "result" in message, message
                    return
    raise AssertionError("the listen stream ended without its result")


def test_a_listen_stream_tells_each_job_once_as_it_ends_whether_it_ended_before_or_after_the_stream(
    floor: tuple[str, redis.Redis, Process], declared: SyncClient
) -> None:
    url, store, worker = floor
    seen: list[dict[str, Any]] = []
    os.killpg(worker.pid, signal.SIGSTOP)  # the jobs stay queued until the stream is subscribed
    try:
        task_ids = [declared.start("raw_noop", {"x": x}) for x in range(8)]
        stream = threading.Thread(target=listen, args=(url, task_ids, seen))
        stream.start()
        channels = [f"celery-task-meta-{task_id}" for task_id in task_ids]
        wait_for(lambda: all(n == 1 for _, n in store.pubsub_numsub(*channels)), 30, 0.02, "the stream's subscriptions")
        assert stream.is_alive() and not seen, "the stream told of a job before any job ran"
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
    stream.join(60)
    assert sorted((n["taskId"], n["status"]) for n in seen) == sorted((t, "completed") for t in task_ids)
    # Each notice carries its own job's result (job x returned x).
    assert {n["taskId"]: n["result"]["content"][0]["text"] for n in seen} == {t: str(x) for x, t in enumerate(task_ids)}
    assert [stored_result(store, task_id)["result"] for task_id in task_ids] == list(range(8))
    # All stored before this stream subscribes: the one read after subscribing must find them.
    again: list[dict[str, Any]] = []
    listen(url, task_ids, again)
    assert sorted((n["taskId"], n["status"]) for n in again) == sorted((t, "completed") for t in task_ids)
