"""`mcp-celery call` and `mcp-celery tasks ...` as a user runs them: subprocesses, and a pseudo-terminal
(pexpect) for the interactive parts, against a real server and prefork worker over HTTP and stdio, and
against FastMCP + fastmcp-tasks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from mcp_celery.client import Journal
from tests.support.client_fixtures import TOKEN, fastmcp_url, listen_url  # noqa: F401  (fixtures)
from tests.support.harness import ROOT, Process, wait_for

CLI = [sys.executable, "-m", "mcp_celery"]
STDIO_SERVER = ["--", sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"]
EXIT_OK, EXIT_TOOL_ERROR, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 3, 4


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "journal" / "tasks.db"


@pytest.fixture
def cli_env(journal_path: Path) -> dict[str, str]:
    return {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(journal_path), "PYTHONPATH": str(ROOT)}


@pytest.fixture(params=["http", "stdio"])
def server(request: pytest.FixtureRequest, worker: Process) -> list[str]:
    """The server options of `mcp-celery call`, put after the other arguments."""
    if request.param == "http":
        return ["--url", request.getfixturevalue("http_url")]
    return STDIO_SERVER


def call(tool: str, args: dict[str, object], server: list[str], env: dict[str, str], *extra: str) -> tuple[int, str]:
    argv = [*CLI, "call", tool, "--args", json.dumps(args), *extra, *server]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


class Exit(int):
    """An exit status that shows the command's stderr when an assertion about it fails."""

    stderr = ""

    def __repr__(self) -> str:
        return f"{int(self)} (stderr: {self.stderr!r})"


def cli(env: dict[str, str], *argv: str) -> tuple[int, str]:
    done = subprocess.run([*CLI, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    status = Exit(done.returncode)
    status.stderr = done.stderr[-2000:]
    return status, done.stdout


def text_of(task: dict[str, Any]) -> str:
    """The text of a completed task's one text block, as `tasks get --json` shows it."""
    (block,) = task["result"]["content"]
    return str(block["text"])


def spawn(env: dict[str, str], *argv: str) -> pexpect.spawn:
    child = pexpect.spawn(CLI[0], [*CLI[1:], *argv], env=env, cwd=str(ROOT), encoding="utf-8", timeout=30,
                          dimensions=(24, 160))  # fmt: skip
    return child


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return int(child.exitstatus)


def test_call_prints_the_result_and_exits_by_outcome(server: list[str], cli_env: dict[str, str]) -> None:
    assert call("echo", {"text": "hi", "times": 2}, server, cli_env) == (EXIT_OK, "hi hi\n")
    code, out = call("boom", {"message": "bad input"}, server, cli_env)
    assert code == EXIT_TOOL_ERROR and "bad input" in out
    code, out = call("protocol_fail", {}, server, cli_env, "--json")
    task = json.loads(out)
    assert code == EXIT_FAILED and (task["status"], task["error"]["code"]) == ("failed", -32602)
    code, out = call("sync_only", {"text": "inline"}, server, cli_env)  # the server answers without a task
    assert (code, out) == (EXIT_OK, "INLINE\n")
    code, out = call("sync_only", {"text": "inline"}, server, cli_env, "--json")  # the final task's shape, no id
    inline = json.loads(out)
    assert code == EXIT_OK and (inline["taskId"], inline["status"]) == (None, "completed")
    assert inline["result"]["content"] == [{"type": "text", "text": "INLINE"}]
    code, listing = cli(cli_env, "tasks", "list", "--json")
    assert [(row["tool"], row["status"]) for row in json.loads(listing)] == [
        ("protocol_fail", "failed"), ("boom", "completed"), ("echo", "completed"),
    ]  # fmt: skip


def test_a_question_is_answered_at_the_prompt(server: list[str], cli_env: dict[str, str]) -> None:
    child = spawn(cli_env, "call", "ask_one", *server)
    child.expect(r"Publish the model\?")
    child.expect(r"confirm.*\[y/n\]")
    child.sendline("maybe")  # not a boolean: asked again
    child.expect(r"\[y/n\]")
    child.sendline("y")
    child.expect("published")
    assert finish(child) == EXIT_OK


def test_ctrl_c_asks_and_cancels_the_task(server: list[str], cli_env: dict[str, str], journal_path: Path) -> None:
    child = spawn(cli_env, "call", "checkpoint_loop", "--args", '{"seconds": 60}', *server)
    child.expect(r"working\S* · step \d+")
    child.sendintr()
    child.expect(r"cancel the task\? \[Y/n\]")
    child.sendline("n")  # keep waiting: the task keeps running
    child.expect(r"step \d+")
    child.sendintr()
    child.expect(r"cancel the task\? \[Y/n\]")
    child.sendline("")
    child.expect("cancelled")
    assert finish(child) == EXIT_CANCELLED
    task_id = Journal(journal_path).entries()[0].task_id
    code, out = cli(cli_env, "tasks", "get", task_id, "--json")
    assert code == EXIT_OK and json.loads(out)["status"] == "cancelled"


def test_a_killed_client_is_resumed_with_tasks_wait(
    server: list[str], cli_env: dict[str, str], journal_path: Path
) -> None:
    argv = [*CLI, "call", "checkpoint_loop", "--args", '{"seconds": 4}', *server]
    client = subprocess.Popen(argv, env=cli_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        entry = wait_for(lambda: journal_path.exists() and (Journal(journal_path).entries() or [None])[0], 30)
        client.send_signal(signal.SIGKILL)
        assert client.wait(timeout=10) == -signal.SIGKILL
    finally:
        if client.poll() is None:
            client.kill()
    assert entry.status == "working"
    code, out = cli(cli_env, "tasks", "wait", entry.task_id[:10])
    assert code == EXIT_OK
    # Exactly the job's result as the server stores it: the 4 s loop's own step count, nothing else.
    stored = json.loads(cli(cli_env, "tasks", "get", entry.task_id, "--json")[1])
    assert stored["status"] == "completed" and re.fullmatch(r"finished \d+ steps", text_of(stored)), stored
    assert out == text_of(stored) + "\n"
    assert Journal(journal_path).get(entry.task_id).status == "completed"


def test_tasks_cancel_and_get_work_from_the_journal(
    server: list[str], cli_env: dict[str, str], journal_path: Path
) -> None:
    child = spawn(cli_env, "call", "checkpoint_loop", "--args", '{"seconds": 60}', *server)
    child.expect(r"step \d+")
    task_id = Journal(journal_path).entries()[0].task_id
    code, out = cli(cli_env, "tasks", "cancel", task_id, "--json")
    after = json.loads(out)  # the task right after the cancel: still winding down, or cancelled
    assert code == EXIT_OK and after["taskId"] == task_id and after["status"] in {"working", "cancelled"}, out
    child.expect("cancelled")
    assert finish(child) == EXIT_CANCELLED
    code, out = cli(cli_env, "tasks", "get", task_id)
    assert code == EXIT_OK and out.startswith(f"{task_id}  cancelled")


def test_tasks_cancel_of_a_finished_task_says_it_changed_nothing(server: list[str], cli_env: dict[str, str]) -> None:
    assert call("echo", {"text": "done"}, server, cli_env) == (EXIT_OK, "done\n")
    code, listing = cli(cli_env, "tasks", "list", "--json")
    task_id = json.loads(listing)[0]["taskId"]
    code, out = cli(cli_env, "tasks", "cancel", task_id)
    assert (code, out) == (EXIT_OK, f"{task_id} had already ended completed: the cancel changed nothing\n")
    code, out = cli(cli_env, "tasks", "cancel", task_id, "--json")
    assert code == EXIT_OK and json.loads(out)["status"] == "completed"


@pytest.mark.venv
def test_call_against_fastmcp_with_fastmcp_tasks(
    fastmcp_url: str,  # noqa: F811
    cli_env: dict[str, str],
    journal_path: Path,
) -> None:
    assert call("add", {"a": 2, "b": 40}, ["--url", fastmcp_url], cli_env) == (EXIT_OK, "42\n")
    child = spawn(cli_env, "call", "slow", "--args", '{"seconds": 30}', "--url", fastmcp_url)
    child.expect(r"working\S* · tick \d+")  # FastMCP's progress message is the task's statusMessage
    child.sendintr()
    child.expect(r"cancel the task\? \[Y/n\]")
    child.sendline("y")
    child.expect("cancelled")
    assert finish(child) == EXIT_CANCELLED
    task_id = Journal(journal_path).entries()[0].task_id
    code, out = cli(cli_env, "tasks", "get", task_id, "--json")
    assert code == EXIT_OK and json.loads(out)["status"] == "cancelled"


def test_call_sends_the_token_and_gets_pushed_updates(listen_url: str, cli_env: dict[str, str]) -> None:  # noqa: F811
    assert call("later", {}, ["--url", listen_url, "--token", TOKEN], cli_env) == (EXIT_OK, "pushed\n")


def test_tasks_commands_take_an_id_that_starts_with_a_dash(
    listen_url: str,  # noqa: F811
    cli_env: dict[str, str],
    journal_path: Path,
) -> None:
    """The listen server's ids start with `-h`: argparse alone would read one as --help."""
    env = {**cli_env, "MCP_CELERY_TOKEN": TOKEN}
    assert call("later", {}, ["--url", listen_url], env) == (EXIT_OK, "pushed\n")
    task_id = Journal(journal_path).entries()[0].task_id
    assert task_id.startswith("-h")
    for argv in (["tasks", "get", task_id, "--json"], ["tasks", "get", "--json", task_id],
                 ["tasks", "get", "--json", "--", task_id]):  # fmt: skip
        code, out = cli(env, *argv)
        assert code == EXIT_OK and json.loads(out)["taskId"] == task_id, (argv, out, code.stderr)
    code, out = cli(env, "tasks", "wait", task_id, "--no-sampling")
    assert (code, out) == (EXIT_OK, "pushed\n"), code.stderr
    code, out = cli(env, "tasks", "get", task_id[:6])  # a unique prefix, as for any id
    assert code == EXIT_OK and out.startswith(f"{task_id}  completed"), code.stderr


def test_a_missing_or_refused_token_is_said_so(listen_url: str, cli_env: dict[str, str]) -> None:  # noqa: F811
    env = {k: v for k, v in cli_env.items() if k != "MCP_CELERY_TOKEN"}
    code, out = cli(env, "call", "later", "--url", listen_url)
    assert (code, out) == (2, "")
    assert code.stderr.strip() == "mcp-celery: 401: this server needs a token (--token or MCP_CELERY_TOKEN)"
    code, _ = cli(env, "call", "later", "--url", listen_url, "--token", "wrong")
    assert code == 2
    assert code.stderr.strip() == "mcp-celery: 401: the server refused the token (--token or MCP_CELERY_TOKEN)"


def test_ctrl_c_during_a_question_asks_after_it_and_asks_the_question_again(
    http_url: str, cli_env: dict[str, str]
) -> None:
    child = spawn(cli_env, "call", "ask_one", "--url", http_url)
    child.expect(r"confirm.*\[y/n\]")
    child.sendintr()
    child.sendline("y")  # the prompt's thread cannot be interrupted: this answer is read, then dropped
    child.expect(r"cancel the task\? \[Y/n\]")
    child.sendline("n")
    child.expect(r"Publish the model\?")  # not answered yet, so asked again
    child.expect(r"\[y/n\]")
    child.sendline("n")
    child.expect("kept")
    assert finish(child) == EXIT_OK
