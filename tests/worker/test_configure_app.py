"""`configure_app` as a worker runs it: called after the `@tool` decorators, in an app that used pickle.

A real prefork worker and HTTP server for `tests.support.late_config_jobs` (its own queue on the suite's broker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import HttpClient, Process, start_http_server, start_worker

APP = "tests.support.late_config_jobs"


@pytest.fixture(scope="module")
def late_worker(env: dict[str, str], logs: Path) -> Iterator[Process]:
    proc = start_worker(env, logs / "late-config-worker.log", queues="late-config", name="late", app=APP, concurrency=1)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def late_client(env: dict[str, str], late_worker: Process, logs: Path) -> Iterator[HttpClient]:
    url, server = start_http_server(env, logs / "late-config-server.log", app=APP)
    client = HttpClient(url)
    yield client
    client.close()
    server.stop()


def test_a_tool_defined_before_configure_app_gets_its_soft_time_limit(late_client: HttpClient) -> None:
    started = time.monotonic()
    task = late_client.wait(late_client.start("until_told_to_stop", {"seconds": 60}), timeout=30)
    # Without a soft limit the hard one (MAX_JOB_S) would have killed the job: `failed`, "time limit".
    assert task["status"] == "completed", task
    assert task["result"]["content"][0]["text"] == "stopped by the soft time limit"
    assert time.monotonic() - started < 30


def test_the_worker_names_the_pickle_settings_configure_app_replaced(late_worker: Process) -> None:
    log = late_worker.output()
    warning = next((line for line in log.splitlines() if "configure_app made this app JSON-only" in line), "")
    assert "accept_content was ['json', 'pickle']" in warning and "task_serializer was 'pickle'" in warning, log
    refused = next((line for line in log.splitlines() if "serialize their messages in a way" in line), "")
    assert "tests.support.late_config_jobs.legacy_pickled (pickle)" in refused and "accept_content" in refused, log
    assert "until_told_to_stop" not in refused  # the tool follows configure_app: JSON
