"""`--log-format json` and MCP_CELERY_LOG_FORMAT=json: a real server and a real prefork worker write one
JSON object per line, with the task id, tool, hashed principal and each status change, and none of a
tool's arguments, its answers or its result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.logs import principal_digest
from mcp_celery.server.edge.tokens import new_token
from tests.support.harness import HttpClient, Process, free_port, http_answers, start_worker, wait_for

PRINCIPAL = "alice-ops-principal"
SECRET_ARGUMENT = "arg-s3cr3t-7Q2"
SECRET_PIN = "pin-s3cr3t-9K4"
#: An answer the job's form rejects (a number where it wants a string): the rejection must not quote it.
REJECTED_PIN = 918273645546372819
SECRETS = [SECRET_ARGUMENT, SECRET_PIN, str(REJECTED_PIN), "result-secret", PRINCIPAL]


@pytest.fixture(scope="module")
def logged(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpClient, Path, Path]]:
    """A JSON-logging server (with a bearer token for PRINCIPAL) and worker of `tests.support.ops_jobs`."""
    folder = tmp_path_factory.mktemp("json-logs")
    token = new_token(PRINCIPAL, folder / "tokens")
    ops_env = {**env, "TEST_OPS_QUEUE": "ops-logs", "MCP_CELERY_AUTH_TOKENS": str(folder / "tokens")}
    worker = start_worker(
        {**ops_env, "MCP_CELERY_LOG_FORMAT": "json"}, folder / "worker.log", queues="ops-logs", name="ops-logs",
        app="tests.support.ops_jobs",
    )  # fmt: skip
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        args = ["--log-level", "INFO", "--log-format", "json", "serve", "-A", "tests.support.ops_jobs", "--http"]
        server = Process(
            [sys.executable, "-m", "mcp_celery", *args, "--port", str(port)], ops_env, folder / "server.log"
        )
        try:
            server.wait_ready(lambda: http_answers(url), 60, "the HTTP server to answer")
            client = HttpClient(url, token=token)
            yield client, folder / "server.log", folder / "worker.log"
            client.close()
        finally:
            server.stop()
    finally:
        worker.stop()


def json_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def events(log: Path, task_id: str) -> dict[str, dict[str, Any]]:
    """The log's lines about `task_id`, by event."""
    return {line["event"]: line for line in json_lines(log) if line.get("task_id") == task_id and "event" in line}


def run_the_secret_job(client: HttpClient) -> str:
    task_id = client.start("keep_secret", {"token": SECRET_ARGUMENT}, elicitation={})
    task = client.wait(task_id, {"input_required"})
    (key,) = task["inputRequests"]
    rejected = {key: {"action": "accept", "content": {"pin": REJECTED_PIN}}}
    client.result("tasks/update", {"taskId": task_id, "inputResponses": rejected})
    assert key in client.get(task_id)["inputRequests"]  # rejected: the request stays outstanding
    answer = {key: {"action": "accept", "content": {"pin": SECRET_PIN}}}
    client.result("tasks/update", {"taskId": task_id, "inputResponses": answer})
    done = client.wait(task_id)
    # The secrets did go through the server and the worker: the result carries them.
    assert f"{SECRET_ARGUMENT}:{SECRET_PIN}:result-secret" in json.dumps(done["result"]), done
    return task_id


def test_each_status_change_is_one_json_line_with_the_task_fields(logged: tuple[HttpClient, Path, Path]) -> None:
    client, server_log, worker_log = logged
    task_id = run_the_secret_job(client)
    digest = principal_digest(PRINCIPAL)
    created = wait_for(lambda: events(server_log, task_id).get("created"), 10, what="the server's created line")
    assert {k: created[k] for k in ("tool", "principal", "status")} == {
        "tool": "keep_secret",
        "principal": digest,
        "status": "working",
    }

    def ended() -> dict[str, dict[str, Any]] | None:
        found = events(worker_log, task_id)
        return found if "ended" in found else None

    worker = wait_for(ended, 10, what="the job's ended line")
    statuses = {event: line.get("status") for event, line in worker.items()}
    assert statuses == {
        "started": "working",
        "input_required": "input_required",
        "answered": "working",
        "ended": "completed",
    }
    assert all(line["tool"] == "keep_secret" and line["principal"] == digest for line in worker.values())
    assert all(line["level"] and line["logger"] and line["time"] for line in worker.values())
    # Every line the server wrote is a JSON object (the worker's banner is Celery's print, not a log line).
    server_text = server_log.read_text().strip().splitlines()
    assert server_text and len(json_lines(server_log)) == len(server_text)


def test_arguments_answers_and_results_never_reach_the_logs(logged: tuple[HttpClient, Path, Path]) -> None:
    client, server_log, worker_log = logged
    task_id = run_the_secret_job(client)

    def celery_success_line() -> dict[str, Any] | None:
        lines = json_lines(worker_log)
        return next((line for line in lines if task_id in line["message"] and "succeeded" in line["message"]), None)

    # Celery's own line for the job's success is there (the last one about it), without the return value.
    assert "(not logged)" in wait_for(celery_success_line, 10, what="Celery's success line")["message"]
    for log in (server_log, worker_log):
        text = log.read_text()
        assert task_id in text
        leaked = [secret for secret in SECRETS if secret in text]
        assert not leaked, f"{log.name} shows {leaked}"
