"""Real SDK clients without the tasks extension, against the session's server and prefork worker.

- the mcp 2.3 `Client` of this environment, over HTTP and stdio (2026-07-28 requests without the extension);
- an mcp 1.x client in a virtualenv of its own, on initialize-era sessions over stdio and HTTP
  (tests/support/mcp1_client.py);
- the TypeScript SDK's client 1.x (tests/support/conformance/ts-plain-client.mjs), `callTool` with
  `resetTimeoutOnProgress`, as hosts built on it call tools.

The suite's servers wait 3 s for a plain call's job (MCP_CELERY_INLINE_S in conftest).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client import ClientRequestContext
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

from mcp_celery.protocol import TASK_HANDLE_META
from tests.support import sample_jobs
from tests.support.client_fixtures import make_venv
from tests.support.harness import ROOT, Process, wait_for

MCP1 = "mcp==1.30.0"
MCP1_VENV = ROOT / "tests" / "support" / ".venv-mcp1"
CONFORMANCE = ROOT / "tests" / "support" / "conformance"
TERMINAL = {"completed", "failed", "cancelled"}


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await body()

    anyio.run(bounded)


def last_text(result: CallToolResult) -> str:
    block = result.content[-1]
    assert isinstance(block, TextContent), result
    return block.text


@pytest.fixture(params=["http", "stdio"])
def target(request: pytest.FixtureRequest, worker: Process, env: dict[str, str]) -> Any:
    if request.param == "http":
        return request.getfixturevalue("http_url")
    args = ["-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"]
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT), env=env)


# ---------------------------------------------------------------- mcp 2.3


async def follow(client: Client, task_id: str) -> CallToolResult:
    while True:
        result = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 3})
        if (result.structured_content or {}).get("status") in TERMINAL:
            return result


def celery_status(task_id: str) -> str:
    """The job's state in Celery's own result backend, read afresh."""
    return str(sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"])


async def until_stepping(client: Client, task_id: str) -> None:
    """Until the `checkpoint_loop` job has reported a step: it is running, past its first checkpoint."""
    while True:
        result = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 1})
        if str((result.structured_content or {}).get("statusMessage", "")).startswith("step "):
            return


def test_the_mcp_2_3_client_gets_a_handle_that_passes_its_output_schema_check_then_the_result(target: Any) -> None:
    async def body() -> None:
        async with Client(target) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"task_status", "task_respond", "task_cancel"} <= names
            # The client validates structuredContent against the (widened) output schema: no error.
            running = await client.call_tool("slow_greeting", {"name": "Ada", "seconds": 4.5})
            assert running.is_error is False and running.meta is not None
            handle = running.meta[TASK_HANDLE_META]
            assert running.structured_content is not None and running.structured_content["taskId"] == handle["taskId"]
            done = await follow(client, handle["taskId"])
            assert (done.structured_content or {})["result"]["structuredContent"] == {
                "text": "Hello, Ada!",
                "length": 11,
            }
            quick = await client.call_tool("slow_greeting", {"name": "Bo", "seconds": 0})
            assert quick.structured_content == {"text": "Hello, Bo!", "length": 10}

    run(body)


def test_the_mcp_2_3_client_answers_a_running_jobs_question_through_mrtr_and_gets_progress(target: Any) -> None:
    asked: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"confirm": True})

    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def body() -> None:
        async with Client(target, elicitation_callback=elicit) as client:
            answered = await client.call_tool("confirm_echo", {"text": "sdk"})
            assert last_text(answered) == "sdk: yes" and asked == ["Echo 'sdk'?"]
            counted = await client.call_tool("legacy_progress", {"steps": 15}, progress_callback=on_progress)
            assert last_text(counted) == "15"

    run(body)
    values = [value for value, _, _ in progress]
    assert values and values == sorted(set(values)), progress
    assert any(total == 15 for _, total, _ in progress), progress


def test_the_mcp_2_3_client_answers_and_cancels_through_the_lifecycle_tools(target: Any) -> None:
    """A client without elicitation: the question waits in the task past the window; task_status shows
    it (waiting for the change), task_respond answers it, task_cancel stops another job."""
    loop_id: list[str] = []  # the cancelled job's task

    async def body() -> None:
        async with Client(target) as client:
            asking = await client.call_tool("confirm_echo", {"text": "later"})
            assert asking.meta is not None, asking
            task_id = asking.meta[TASK_HANDLE_META]["taskId"]
            status = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 3})
            assert (status.structured_content or {})["status"] == "input_required", status
            assert list((status.structured_content or {})["inputRequests"]) == ["elicit-1"], status
            answer = {"elicit-1": {"action": "accept", "content": {"confirm": True}}}
            taken = await client.call_tool("task_respond", {"task_id": task_id, "responses": answer})
            assert taken.is_error is False and (taken.structured_content or {})["taken"] == ["elicit-1"], taken
            done = await follow(client, task_id)
            assert (done.structured_content or {})["status"] == "completed" and last_text(done) == "later: yes", done

            running = await client.call_tool("checkpoint_loop", {"seconds": 60})
            assert running.meta is not None, running
            loop_id.append(running.meta[TASK_HANDLE_META]["taskId"])
            await until_stepping(client, loop_id[0])
            cancelled = await client.call_tool("task_cancel", {"task_id": loop_id[0]})
            assert cancelled.is_error is False, cancelled
            ended = await follow(client, loop_id[0])
            assert (ended.structured_content or {})["status"] == "cancelled", ended

    run(body)
    # `cancelled` alone comes also from the server's grace running out with the job still going: the
    # job itself stopped at a checkpoint only if Celery holds REVOKED (it would run on for 60 s otherwise).
    wait_for(lambda: celery_status(loop_id[0]) == "REVOKED", 30, what="the job to stop (Celery's REVOKED)")


# ---------------------------------------------------------------- mcp 1.x


def mcp1_python() -> Path:
    """The virtualenv's python, made when missing (as the suite's other client virtualenvs are)."""
    problem = make_venv(MCP1_VENV, [MCP1])
    assert problem is None, problem
    return MCP1_VENV / "bin" / "python"


@pytest.mark.venv
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_mcp_1_x_client_on_an_initialize_era_session(transport: str, http_url: str, env: dict[str, str]) -> None:
    where = [sys.executable, str(ROOT)] if transport == "stdio" else [http_url]
    env_without_our_path = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(mcp1_python()), str(ROOT / "tests" / "support" / "mcp1_client.py"), transport, *where],
        capture_output=True, text=True, timeout=180, env=env_without_our_path, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["protocolVersion"] in {"2025-06-18", "2025-11-25"}, seen
    assert {"task_status", "task_respond", "task_cancel"} <= set(seen["tools"])
    values = [value for value, _, _ in seen["progress"]]
    assert values and values == sorted(set(values)) and seen["progress_result"] == "15", seen
    assert seen["handle"]["status"] == "working" and seen["handle_structured"]["taskId"] == seen["handle"]["taskId"]
    assert seen["final"] == {"text": "Hello, Ada!", "length": 11}
    assert seen["question"] == f"{transport}: yes", seen
    if transport == "stdio":  # a session that can be asked is asked, with no model round trip
        assert seen["asked_on_session"] == ["Echo 'stdio'?"] and "question_handle" not in seen, seen
    else:  # a stateless HTTP session cannot be sent requests: the question waits for task_respond
        assert seen["asked_on_session"] == [] and seen["question_handle"]["status"] == "input_required", seen


# ---------------------------------------------------------------- the TypeScript SDK


def node_client() -> list[str]:
    """The node command for ts-plain-client.mjs, with the packages installed (npm ci) when missing."""
    if not (CONFORMANCE / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        npm = ["npm", "ci", "--prefix", str(CONFORMANCE), "--no-audit", "--no-fund", "--loglevel=error"]
        subprocess.run(npm, check=True, capture_output=True, timeout=600)
    pinned = CONFORMANCE / "node_modules" / ".bin" / "node"
    node = str(pinned) if pinned.exists() else shutil.which("node")
    assert node, "node is not installed"
    return [node, str(CONFORMANCE / "ts-plain-client.mjs")]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_typescript_sdk_client_keeps_waiting_on_progress_and_follows_the_handle(
    transport: str, http_url: str, env: dict[str, str]
) -> None:
    where = [http_url] if transport == "http" else [sys.executable, str(ROOT)]
    out = subprocess.run(
        [*node_client(), transport, *where], capture_output=True, text=True, timeout=180, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert {"task_status", "task_respond", "task_cancel"} <= set(seen["tools"])
    # A 1 s request timeout outlived by a 2.5 s job: the progress reset it, and only with the opt-in.
    assert seen["keptAlive"] == "25" and len(seen["progress"]) >= 3, seen
    assert seen["withoutReset"] == -32001, seen  # the SDK's request timeout
    assert seen["isError"] is False and seen["handle"]["status"] == "working", seen
    assert seen["handleStructured"]["taskId"] == seen["handle"]["taskId"]
    assert seen["final"] == {"text": "Hello, Ada!", "length": 11}, seen


def test_the_mcp1_virtualenv_stays_out_of_the_package_and_git() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", str(MCP1_VENV)], cwd=ROOT)
    assert ignored.returncode == 0, "tests/support/.venv-mcp1 must be ignored by git"
    assert os.path.relpath(MCP1_VENV, ROOT).startswith("tests")
