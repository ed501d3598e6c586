"""What Flower shows of MCP tasks, read through Flower's HTTP API.

A real Flower process (`celery -A tests.support.sample_jobs flower`) watches the session's prefork worker
while jobs are started, answered and cancelled through a real `mcp-celery serve --http`. Flower
builds its task list from worker events only (celery.events.state), so each check here is about
the events the worker and the server send.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, caps, free_port, wait_for

ELICIT = caps(elicitation={})


class Flower:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10)

    def info(self, task_id: str) -> dict[str, Any] | None:
        """Flower's view of one task (`/api/task/info`), or None while Flower has not seen it."""
        response = self.http.get(f"/api/task/info/{task_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    def tasks(self, **query: str) -> dict[str, dict[str, Any]]:
        response = self.http.get("/api/tasks", params=query)
        response.raise_for_status()
        return dict(response.json())

    def wait_state(self, task_id: str, state: str, timeout: float = 15) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            info = self.info(task_id)
            return info if info and info["state"] == state else None

        return wait_for(check, timeout, 0.05, f"Flower to show {task_id} {state} (now {self.info(task_id)})")

    def events_counted(self, event_type: str, task_name: str) -> float:
        """Flower's own count of the events of a type it received for a task name (Prometheus /metrics)."""
        metrics = self.http.get("/metrics").text
        pattern = re.compile(r"^flower_events_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)
        return sum(
            float(m["value"])
            for m in pattern.finditer(metrics)
            if f'type="{event_type}"' in m["labels"] and f'task="{task_name}"' in m["labels"]
        )


@pytest.fixture(scope="module")
def flower(env: dict[str, str], worker: Process, client: HttpClient, logs: Path) -> Iterator[Flower]:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.support.sample_jobs",
        "flower",
        "--address=127.0.0.1",
        f"--port={port}",
    ]
    proc = Process(args, {**env, "FLOWER_UNAUTHENTICATED_API": "true"}, logs / "flower.log")
    view = Flower(f"http://127.0.0.1:{port}")

    def healthy() -> bool:
        assert proc.alive(), proc.output()
        try:
            return view.http.get("/healthcheck").text == "OK"
        except httpx.TransportError:
            return False

    wait_for(healthy, 60, 0.1, "Flower to answer")
    # Flower sees only events sent after it subscribed: run jobs until one shows up.
    wait_for(lambda: view.info(client.start("echo", {"text": "hello flower"})), 30, 0.5, "Flower to see a task")
    yield view
    view.http.close()
    proc.stop()


@pytest.fixture(scope="module")
def client(http_url: str) -> Iterator[HttpClient]:
    c = HttpClient(http_url)
    yield c
    c.close()


def answer(client: HttpClient, task_id: str, content: dict[str, Any]) -> None:
    task = client.wait(task_id, {"input_required"})
    (key,) = task["inputRequests"]
    client.result(
        "tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": content}}}
    )


def by_tool(flower: Flower, tool: str) -> dict[str, dict[str, Any]]:
    """Flower's search for the jobs of an MCP tool (the server names the tool in Celery's argsrepr)."""
    return flower.tasks(search=f'args:"[mcp tool {tool}]"')


def test_an_mcp_task_is_found_in_flower_by_its_task_id_and_its_tool_name(
    client: HttpClient, flower: Flower, worker: Process
) -> None:
    task_id = client.start("echo", {"text": "find me"})  # the MCP taskId is the Celery task id
    assert client.wait(task_id)["status"] == "completed"
    info = flower.wait_state(task_id, "SUCCESS")
    assert info["name"] == "tests.support.sample_jobs.echo"  # Flower's name is Celery's: taskname= needs it
    assert info["args"] == "[mcp tool echo]" and info["kwargs"] == repr({"text": "find me", "times": 1})
    assert task_id in by_tool(flower, "echo") and task_id in flower.tasks(taskname="tests.support.sample_jobs.echo")

    # An existing task exposed under a tool name: the same search finds its MCP jobs and not
    # the ones other code queued the ordinary Celery way.
    mcp_job = client.start("legacy_progress", {"steps": 1})
    plain_job = sample_jobs.legacy_progress.delay(1).id  # type: ignore[attr-defined]
    for job in (mcp_job, plain_job):
        flower.wait_state(job, "SUCCESS")
    found = by_tool(flower, "legacy_progress")
    assert mcp_job in found and plain_job not in found
    assert not by_tool(flower, "legacy_progres") and task_id not in found  # the closing bracket: exact


def test_a_waiting_job_shows_input_required_in_flower_and_leaves_it_once_answered(
    client: HttpClient, flower: Flower
) -> None:
    task_id = client.start("ask_then_work", {"seconds": 30}, elicitation={})
    waiting = flower.wait_state(task_id, "INPUT_REQUIRED")
    assert waiting["result"] == "waiting for input"
    assert task_id in flower.tasks(state="INPUT_REQUIRED")
    answer(client, task_id, {"confirm": True})
    # The job works on without reporting progress: Flower must not go on saying it waits.
    flower.wait_state(task_id, "STARTED")
    client.result("tasks/cancel", {"taskId": task_id})
    flower.wait_state(task_id, "REVOKED")


def test_a_task_cancelled_while_running_shows_revoked_in_flower(
    client: HttpClient, flower: Flower, store_redis: redis.Redis
) -> None:
    marker = f"marker-{uuid.uuid4()}"
    task_id = client.start("checkpoint_loop", {"seconds": 60, "marker": marker})
    wait_for(lambda: store_redis.get(marker), 15, what="the job to start")
    flower.wait_state(task_id, "PROGRESS")
    client.result("tasks/cancel", {"taskId": task_id})
    assert client.wait(task_id)["status"] == "cancelled"
    revoked = flower.wait_state(task_id, "REVOKED")
    assert revoked["revoked"] is not None
    assert task_id in flower.tasks(state="REVOKED")


def test_a_task_cancelled_while_waiting_for_input_shows_revoked_in_flower(client: HttpClient, flower: Flower) -> None:
    task_id = client.start("ask_one", {"timeout": 60}, elicitation={})
    flower.wait_state(task_id, "INPUT_REQUIRED")
    client.result("tasks/cancel", {"taskId": task_id})
    assert client.wait(task_id)["status"] == "cancelled"
    flower.wait_state(task_id, "REVOKED")


def test_progress_shows_in_flower_as_it_happens_at_most_one_event_per_half_second(
    client: HttpClient, flower: Flower
) -> None:
    """`checkpoint_loop` calls ctx.status every 50 ms for 3 s (about 60 calls). Flower shows the
    task in state PROGRESS with the latest message it was sent in `result`, the message moves on
    while the job runs, and Flower counts at most one `task-progress` event per 0.5 s; the final
    result then replaces the progress message."""
    before = flower.events_counted("task-progress", "tests.support.sample_jobs.checkpoint_loop")
    task_id = client.start("checkpoint_loop", {"seconds": 3})
    seen: set[int] = set()

    def steps_seen() -> bool:
        info = flower.info(task_id)
        if info and info["state"] == "PROGRESS":
            step = re.fullmatch(r"step (\d+)", info["result"])
            assert step, info
            seen.add(int(step[1]))
        return len(seen) >= 3

    wait_for(steps_seen, 15, 0.1, "three different progress messages in Flower")
    assert client.wait(task_id)["status"] == "completed"
    done = flower.wait_state(task_id, "SUCCESS")
    assert re.fullmatch(r"'finished \d+ steps'", done["result"]), done
    steps = int(re.findall(r"\d+", done["result"])[0])
    sent = flower.events_counted("task-progress", "tests.support.sample_jobs.checkpoint_loop") - before
    assert steps >= 30, done  # the job did call status() in a tight loop
    assert 3 <= sent <= 3 / 0.5 + 2, sent  # throttled: 0.5 s apart over 3 s, plus the first
