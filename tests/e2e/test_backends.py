"""Any Celery result backend: PostgreSQL, SQLite or none; mcp-celery's state lives in its own Redis.

Real prefork workers and servers for `tests.support.backend_jobs`, whose Celery result backend each
parameter chooses; MCP_CELERY_REDIS_URL points mcp-celery at the suite's Redis. `tasks/get`
reads only mcp-celery's record, so everything MCP shows comes from what the worker side wrote
there, while ordinary Celery callers of an exposed task still get results from Celery's backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.support import backend_jobs
from tests.support.harness import ROOT, HttpClient, caps, start_http_server, start_worker, wait_for

POSTGRESQL = os.environ.get("TEST_POSTGRESQL_BACKEND", "db+postgresql+psycopg://postgres@127.0.0.1:5432/test")
ELICIT = caps(elicitation={})


def backend_url(kind: str, tmp: Path) -> str:
    return {"none": "", "sqlite": f"db+sqlite:///{tmp / 'results.sqlite'}", "postgresql": POSTGRESQL}[kind]


class Stack:
    def __init__(self, kind: str, url: str, client: HttpClient) -> None:
        self.kind, self.url, self.client = kind, url, client

    def celery_caller(self) -> Celery:
        """A plain Celery client of the same broker and result backend: 'other code' calling the task."""
        return Celery("caller", broker=backend_jobs.app.conf.broker_url, backend=self.url or None)


@pytest.fixture(scope="module", params=["none", "sqlite", "postgresql"])
def stack(
    request: pytest.FixtureRequest, patient_env: dict[str, str], logs: Path, tmp_path_factory: Any
) -> Iterator[Stack]:
    """A worker and a server for one result backend; their cancel grace is conftest.PATIENT_GRACE_S."""
    kind = str(request.param)
    url = backend_url(kind, tmp_path_factory.mktemp(f"backend-{kind}"))
    own = {**patient_env, "BACKEND_JOBS_RESULT_BACKEND": url, "MCP_CELERY_REDIS_URL": os.environ["TEST_RESULT_BACKEND"]}
    worker = start_worker(
        own, logs / f"backend-{kind}-worker.log", queues=backend_jobs.QUEUE, name=f"backend-{kind}",
        app="tests.support.backend_jobs", concurrency=2,
    )  # fmt: skip
    http_url, server = start_http_server(own, logs / f"backend-{kind}-http.log", app="tests.support.backend_jobs")
    client = HttpClient(http_url)
    yield Stack(kind, url, client)
    client.close()
    server.stop()
    worker.stop()


def text(task: dict[str, Any]) -> str:
    return str(task["result"]["content"][0]["text"])


@pytest.mark.broker
def test_results_and_tool_errors_come_from_mcp_celery_s_record(stack: Stack) -> None:
    done = stack.client.wait(stack.client.start("double", {"n": 21}), timeout=30)
    assert done["status"] == "completed" and text(done) == "42"
    failed = stack.client.wait(stack.client.start("refuse", {"reason": "nope"}), timeout=30)
    assert failed["status"] == "completed" and failed["result"]["isError"] is True
    assert "ValueError: nope" in text(failed)


@pytest.mark.broker
def test_questions_progress_and_cancel_work_whatever_the_backend(stack: Stack) -> None:
    client = stack.client
    task_id = client.start("confirm", elicitation={})
    asked = client.wait(task_id, {"input_required"}, timeout=30)
    (key,) = asked["inputRequests"]
    client.result(
        "tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
    )
    assert text(client.wait(task_id, timeout=30)) == "yes"

    # Progress an ordinary Celery task reports with update_state shows as statusMessage.
    counting = client.start("count", {"n": 3, "hold_s": 60})
    wait_for(lambda: client.get(counting).get("statusMessage") == "3/3", 30, what="the progress 3/3")
    client.result("tasks/cancel", {"taskId": counting})
    # Without a result backend there is no Celery state to read: with the stack's grace beyond this wait,
    # only the job waking from its 60 s hold and storing how it ended makes the task read cancelled.
    cancelled = client.wait(counting, timeout=30)
    assert cancelled["status"] == "cancelled" and "grace" not in cancelled.get("statusMessage", ""), cancelled


@pytest.mark.broker
def test_ordinary_celery_callers_of_an_exposed_task_still_get_results_the_celery_way(stack: Stack) -> None:
    assert text(stack.client.wait(stack.client.start("add", {"x": 2, "y": 3}), timeout=30)) == "5"
    caller = stack.celery_caller()
    result = caller.send_task("tests.support.backend_jobs.add", args=(20, 22), queue=backend_jobs.QUEUE)
    if stack.kind == "none":
        with pytest.raises(NotImplementedError):  # no result backend: Celery callers cannot read results
            result.get(timeout=5)
    else:
        assert result.get(timeout=30) == 42


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_without_redis_for_mcp_celery_server_and_worker_refuse_to_start_in_one_line(
    command: str, env: dict[str, str], logs: Path
) -> None:
    bare = {k: v for k, v in env.items() if k != "MCP_CELERY_REDIS_URL"}
    bare["BACKEND_JOBS_RESULT_BACKEND"] = POSTGRESQL
    args = {
        "serve": [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.backend_jobs"],
        "worker": [sys.executable, "-m", "celery", "-A", "tests.support.backend_jobs"]
        + ["worker", "-P", "solo", "-Q", "refused"],
    }[command]
    done = subprocess.run(
        args, env=bare, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert done.returncode != 0, done
    lines = [line for line in done.stderr.splitlines() if line.startswith("mcp-celery:")]
    assert len(lines) == 1, done.stderr
    assert "set MCP_CELERY_REDIS_URL" in lines[0] and "db+postgresql+psycopg://..." in lines[0], lines
    assert "postgres@" not in lines[0]  # the backend's URL is never quoted whole
