"""`mcp-celery serve` at start: finding the app from another directory, and what it says.

Real `serve` subprocesses against the suite's Redis, started from a directory that is not the
project's, as a desktop host starts them: `--workdir`, `-A path/to/proj.py`, the import error that
names the directories searched (and `top`'s `--workdir`), the "listening on" line of `--http`, a
tool without a docstring (its description, and the warning), and the commands `--help` lists.
Their PYTHONPATH holds this checkout only (the code under test), never the project.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery

import mcp_celery
from mcp_celery.core.tools import registry
from mcp_celery.redact import redact
from mcp_celery.testing.jsonrpc import RawStdioClient
from tests.support.harness import ROOT, free_port, session_redis, wait_for
from tests.support.snippet_scenario import host_session_tools

PROJECT = '''
import os

from celery import Celery

import mcp_celery

app = Celery("proj", broker=os.environ["CELERY_BROKER_URL"], backend=os.environ["CELERY_RESULT_BACKEND"])


@mcp_celery.tool(app)
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@app.task
def add(x: int, y: int = 1) -> int:
    return x + y


mcp_celery.expose(add)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "proj.py").write_text(PROJECT)
    return folder


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """The directory a host starts the server in: not the project's."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.fixture
def host_env(env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "CELERY_BROKER_URL": session_redis(12),
        "CELERY_RESULT_BACKEND": session_redis(13),
    }


def serve(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcp_celery", "serve", *args]


@pytest.mark.parametrize(
    "how", [["-A", "proj", "--workdir", "{project}"], ["-A", "{project}/proj.py"], ["-A", "{project}/proj.py:app"]]
)
def test_a_stdio_server_started_in_another_directory_finds_the_project(
    how: list[str], project: Path, elsewhere: Path, host_env: dict[str, str]
) -> None:
    args = [arg.format(project=project) for arg in how]
    client = RawStdioClient(serve(*args), host_env, elsewhere / "serve.log", cwd=elsewhere)
    try:
        tools = host_session_tools(client)  # initialize, then tools/list, as a host does
    finally:
        client.close()
    assert {"shout", "add"} <= set(tools), (elsewhere / "serve.log").read_text()


def test_without_a_way_to_the_project_the_error_names_the_directories_searched(
    project: Path, elsewhere: Path, host_env: dict[str, str]
) -> None:
    out = subprocess.run(
        serve("-A", "proj"), cwd=elsewhere, env=host_env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("mcp-celery: cannot import 'proj': No module named 'proj'; searched "), line
    assert str(elsewhere) in line and str(project) not in line, line
    assert "--workdir DIR" in line and "PYTHONPATH" in line, line
    missing = subprocess.run(
        serve("-A", str(project / "nope.py")), cwd=elsewhere, env=host_env, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert missing.returncode == 2 and f"no such file '{project / 'nope.py'}'" in missing.stderr, missing.stderr
    not_a_folder = subprocess.run(
        serve("-A", "proj", "--workdir", str(project / "proj.py")), cwd=elsewhere, env=host_env,
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert not_a_folder.returncode == 2 and "not a directory" in not_a_folder.stderr, not_a_folder.stderr


def test_top_takes_the_workdir_too(project: Path, elsewhere: Path, host_env: dict[str, str]) -> None:
    top = [sys.executable, "-m", "mcp_celery", "top", "-A", "proj", "--once"]
    found = subprocess.run([*top, "--workdir", str(project)], cwd=elsewhere, env=host_env, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert found.returncode == 0 and "TASKS NOW" in found.stdout, found.stdout + found.stderr
    lost = subprocess.run(top, cwd=elsewhere, env=host_env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert lost.returncode == 2 and "cannot import 'proj'" in lost.stderr, lost.stderr


def test_serve_http_says_where_it_listens_and_warns_of_a_tool_without_a_docstring(
    project: Path, elsewhere: Path, host_env: dict[str, str]
) -> None:
    port = free_port()
    log = elsewhere / "serve-http.log"
    args = serve("-A", "proj", "--workdir", str(project), "--http", "--port", str(port))
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=elsewhere, env=host_env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        line = wait_for(
            lambda: next((x for x in log.read_text().splitlines() if "listening on" in x), None), 30, what="listening"
        )
        redis_url = redact(host_env.get("MCP_CELERY_REDIS_URL") or session_redis(13))  # the store's Redis
        assert line == (
            f"mcp-celery: listening on http://127.0.0.1:{port}/mcp (app proj, 2 tools, Redis {redis_url}; "
            "1 server process; /metrics open, no authentication configured)"
        ), log.read_text()
        warning = next(x for x in log.read_text().splitlines() if "no docstring" in x)
        assert "tool 'add' has no docstring" in warning and "shout" not in warning, warning
        # The port is taken now: a second server says so in one line, before listening on anything.
        again = subprocess.run(args, cwd=elsewhere, env=host_env, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)  # fmt: skip
        assert again.returncode == 2 and f"cannot listen on 127.0.0.1 port {port}" in again.stderr, again.stderr
        assert "listening on" not in again.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_help_lists_every_command_and_the_client_commands_run_after_root_options() -> None:
    helped = subprocess.run([sys.executable, "-m", "mcp_celery", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert "{serve,token,top,demo,call,tasks}" in helped.stdout, helped.stdout
    for command in ("call", "tasks"):
        assert f"\n    {command} " in helped.stdout, helped.stdout
    nested = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "--log-level", "INFO", "tasks", "--help"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert nested.returncode == 0 and "{list,get,wait,cancel}" in nested.stdout, nested.stdout + nested.stderr


def test_a_tool_without_a_docstring_is_described_by_its_call_and_celery_name() -> None:
    app = Celery("undescribed", set_as_current=False)

    @app.task(name="proj.tasks.scale")
    def scale(values: list[float], factor: float = 2.0, label: str | None = None) -> list[float]:
        return [v * factor for v in values]

    @mcp_celery.tool(app)
    def documented(ctx: mcp_celery.JobContext, text: str) -> str:
        """Says what it does."""
        return text

    mcp_celery.expose(scale)
    tools = registry(app)
    assert tools["scale"].described is False
    assert tools["scale"].to_wire()["description"] == (
        "scale(values: array, factor: number = 2.0, label: string | null = null): runs the Celery task "
        "proj.tasks.scale (it has no docstring)."
    )
    assert tools["documented"].described is True and tools["documented"].description == "Says what it does."
