"""The client libraries agents are built on, each pinned and driven through its own tool layer: every case passes.

A server with the default inline window (MCP_CELERY_INLINE_S unset: 20 s, each client's own window below
its timeout) and a prefork worker of its own; every library's driver (tests/support/interop/run_*.py, in the
library's virtualenv: tests/support/interop/venvs.py) runs the cases of tests/support/interop/scripted.py at the same
time: a short job, a job past the window, a job that asks early and late, a cancel, and a 12 s job with
the library's default timeout. The drivers report what the model saw; the server's ended stream says
what became of every job (no job run twice, none left running, each cancel a cancel).

Marked `interop`: CI runs it in a pass of its own, beside the others, once the virtualenvs are made.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery.store.schema import Keys
from tests.support.harness import require_service, start_http_server, start_worker
from tests.support.interop.scripted import CASES
from tests.support.interop.venvs import HERE, LIBRARIES, missing, python_of

#: The longest a driver may take for all its cases: about 45 s of jobs, 100 s with all eight at once on a
#: loaded 2-core machine (their imports).
DRIVER_TIMEOUT_S = 240
pytestmark = [pytest.mark.interop, pytest.mark.timeout(DRIVER_TIMEOUT_S + 120)]  # the first test makes the outcomes
#: Where the outcomes go for the docs' table (docs/guides/clients.md), under the session's logs.
RESULTS = "interop-results.json"


@pytest.fixture(scope="module")
def interop_url(env: dict[str, str], store_redis: redis.Redis, logs: Path) -> Iterator[str]:
    served = {key: value for key, value in env.items() if key != "MCP_CELERY_INLINE_S"}  # the default window
    # Jobs of every library at once: a worker with a process for each (the session's has 4, and may be busy).
    worker = start_worker(served, logs / "interop-worker.log", name=f"interop-{os.getpid()}", concurrency=10)
    url, server = start_http_server(served, logs / "interop-server.log")
    yield url
    server.stop()
    worker.stop()


@pytest.fixture(scope="module")
def outcomes(interop_url: str, store_redis: redis.Redis, logs: Path) -> dict[str, Any]:
    """Every library's cases, played at the same time: library -> case -> outcome (or why it could not run)."""
    since = f"{int(time.time() * 1000)}-0"
    running: dict[str, tuple[subprocess.Popen[str], Path]] = {}
    found: dict[str, Any] = {}
    for name, library in LIBRARIES.items():
        reason = missing(library.venv)
        if reason is not None:
            found[name] = reason
            continue
        log = logs / f"interop-{name}.log"
        args = [str(python_of(library.venv)), str(HERE / library.driver), interop_url, *library.mode, *CASES]
        with log.open("w") as stderr:
            running[name] = (subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True), log)
    for name, (process, log) in running.items():
        try:
            out, _ = process.communicate(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        found[name] = {line["case"]: line for line in lines} if lines else f"no outcome: {log.read_text()[-2000:]}"
    found["_ended"] = ended_since(store_redis, since, expected=sum(len(CASES) for _ in running))
    (logs / RESULTS).write_text(json.dumps(found, indent=2))
    return found


def ended_since(store: redis.Redis, since: str, expected: int) -> Counter[str]:
    """ "TOOL STATUS" of every task that ended since `since`, once `expected` have (or 30 s have passed), and
    a moment more: a job run twice, or a cancelled one that ran on, would end later."""
    deadline = time.monotonic() + 30
    entries: list[Any] = []
    while time.monotonic() < deadline:
        entries = store.xrange(Keys().ended(), min=since)
        if len(entries) >= expected:
            break
        time.sleep(0.5)
    time.sleep(3)
    entries = store.xrange(Keys().ended(), min=since)
    return Counter(f"{fields[b'tool'].decode()} {fields[b'status'].decode()}" for _, fields in entries)


def outcome(outcomes: dict[str, Any], library: str) -> dict[str, Any]:
    found = outcomes[library]
    if isinstance(found, str) and "is missing" in found:
        require_service("interop", found)
    assert isinstance(found, dict), found
    return found


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_every_case_reaches_its_result_through_the_librarys_tool_layer(outcomes: dict[str, Any], library: str) -> None:
    played = outcome(outcomes, library)
    assert set(played) == set(CASES), played
    for name, case in CASES.items():
        seen = played[name]
        assert seen["error"] is None, seen
        assert case.expect.lower() in seen["final"].lower(), seen
        assert not any("error occurred" in text.lower() or "timed out" in text.lower() for text in seen["seen"]), seen
    asked = played["asks"]
    assert asked["answered_in_band"] + asked["calls"].count("task_respond") == 2, asked  # each question once


def test_each_job_ran_once_and_each_cancel_reached_the_server(outcomes: dict[str, Any]) -> None:
    libraries = [name for name in LIBRARIES if isinstance(outcomes[name], dict)]
    if not libraries:
        require_service("interop", "no client library's virtualenv is there")
    ended = outcomes["_ended"]
    assert ended["slow_greeting completed"] == 3 * len(libraries), ended  # short, long, twelve
    assert ended["ask_early_and_late completed"] == len(libraries), ended
    assert ended["slow_greeting cancelled"] == len(libraries), ended
    assert sum(ended.values()) == len(CASES) * len(libraries), ended


def test_openai_agents_with_its_defaults_gets_a_handle_for_a_12_s_job_and_its_result_through_task_status(
    outcomes: dict[str, Any],
) -> None:
    twelve = outcome(outcomes, "openai-agents")["twelve"]
    first = twelve["seen"][0]  # what the model read of the call itself, after its client's 5 s at most
    assert "still running" in first and "task_status with" in first and "error" not in first.lower(), first
    assert twelve["calls"][0] == "slow_greeting" and set(twelve["calls"][1:]) == {"task_status"}, twelve
    assert "Hello, Cy!" in twelve["final"], twelve


def test_pydantic_ai_with_its_defaults_shows_the_model_the_next_call_of_a_handle_and_of_a_question(
    outcomes: dict[str, Any],
) -> None:
    played = outcome(outcomes, "pydantic-ai")
    handle = json.loads(played["long"]["seen"][0])  # pydantic-ai shows the model the structuredContent only
    assert handle["nextCall"]["tool"] == "task_status" and "task_status with" in handle["message"], handle
    question = json.loads(played["asks"]["seen"][0])
    assert question["status"] == "input_required" and question["nextCall"]["tool"] == "task_respond", question
    assert question["exampleAnswer"] == question["nextCall"]["arguments"]["responses"], question
    assert played["asks"]["calls"].count("task_respond") == 2, played["asks"]  # the model answered both
