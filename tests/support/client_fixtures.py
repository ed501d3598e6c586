"""Servers for the client tests besides mcp-celery's own.

`listen_url`: tests/support/listen_server.py over Streamable HTTP behind the bearer token `TOKEN`; it pushes
`notifications/tasks` over `subscriptions/listen`.

`fastmcp_url`: tests/support/fastmcp_server.py (FastMCP 4.1.4 + fastmcp-tasks 4.1.4) in bench/.venv-fastmcp.

The virtualenv is created when missing (about 30 s from a warm package cache; its packages exclude this
project's redis-py, so it cannot share our environment), by one session while any other waits, or ahead
by `python -m tests.support.client_fixtures` (as CI does). The tests skip, saying why, only when creating
it fails, and fail instead where MCP_CELERY_TEST_REQUIRE names `fastmcp` (as CI does). Docket keeps its
state in database 14 of the test Redis.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import ROOT, Process, free_port, require_service, wait_for

VENV = ROOT / "bench" / ".venv-fastmcp"
PYTHON = VENV / "bin" / "python"
PACKAGES = ["fastmcp==4.1.4", "fastmcp-tasks==4.1.4"]
TOKEN = "client-tests-token"
#: The listen server's output, under the session's `logs` folder (it names the tokens it refused).
LISTEN_SERVER_LOG = "listen-server.log"


def _ensure_venv() -> str | None:
    """None when the venv is ready, else why it could not be made."""
    return make_venv(VENV, PACKAGES)


def installer(python: Path) -> list[str]:
    """The command that installs packages into the virtualenv of `python`: uv's pip where uv is
    installed (the [dev] extra brings it), a tenth of pip's CPU for the same packages; else its pip.

    Neither compiles every module it installs: the interpreter compiles those a test imports.
    """
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "install", "--quiet", "--python", str(python)]
    return [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]


def make_venv(home: Path, packages: list[str]) -> str | None:
    """Make the virtualenv `home` with `packages` unless it is there; None when it is ready, else why not.

    Sessions running side by side (pytest-xdist's workers) take turns: one makes it, the others wait.
    """
    python = home / "bin" / "python"
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".making").open("w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if python.exists():
            return None
        try:
            subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, capture_output=True, timeout=120)
            subprocess.run([*installer(python), *packages], check=True, capture_output=True, timeout=900)
        except (subprocess.SubprocessError, OSError) as exc:
            python.unlink(missing_ok=True)  # half made: made again next time
            return f"could not create {home} with {' '.join(packages)}: {exc}"
    return None if python.exists() else f"{python} missing after the install"


@pytest.fixture(scope="session")
def fastmcp_url(logs: Path) -> Iterator[str]:
    require_service("fastmcp", _ensure_venv())
    port = free_port()
    redis_url = os.environ["TEST_RESULT_BACKEND"].rsplit("/", 1)[0] + "/14"  # conftest uses 12 and 13
    server = Process([str(PYTHON), str(ROOT / "tests" / "support" / "fastmcp_server.py"), str(port), redis_url],
                     os.environ, logs / "fastmcp-server.log")  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"

    wait_for(lambda: _answers(url, server), 60, 0.1, "the FastMCP server to answer")
    yield url
    server.stop()


@pytest.fixture(scope="session")
def listen_url(logs: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, str(ROOT / "tests" / "support" / "listen_server.py"), str(port), TOKEN]
    server = Process(args, {**os.environ, "PYTHONPATH": str(ROOT)}, logs / LISTEN_SERVER_LOG)
    url = f"http://127.0.0.1:{port}/mcp"
    wait_for(lambda: _answers(url, server), 60, 0.1, "the listen server to answer")
    yield url
    server.stop()


def _answers(url: str, server: Process) -> bool:
    assert server.alive(), server.output()
    try:
        return httpx.post(url, json={}, timeout=1).status_code < 500
    except httpx.TransportError:
        return False


if __name__ == "__main__":  # `python -m tests.support.client_fixtures`: make the FastMCP virtualenv ahead (.ci/run)
    sys.exit(_ensure_venv())
