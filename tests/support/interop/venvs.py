"""The virtualenvs of the interop suite: each client library pinned, in as few virtualenvs as their pins allow.

`python -m tests.support.interop.venvs` makes the missing ones (CI runs it in the background while the main pass
runs, as it makes the FastMCP virtualenv of the client tests); the tests never make them: a missing one
skips its library's test, saying why, unless MCP_CELERY_TEST_REQUIRE names `interop` (as CI sets).

Grouped where the pins agree: `agents` holds fastmcp 4.1.6, openai-agents 0.24.0, agent-framework-core
1.23.0 and pydantic-ai-slim 2.68 (all on mcp 2.3); `strands` (strands-agents pins mcp < 2.2); `langchain`
(langchain-mcp-adapters pins mcp < 2). fastmcp 4.1.4 + fastmcp-tasks 4.1.4 is the client tests'
virtualenv (bench/.venv-fastmcp, `tests.support.client_fixtures`). Installed with uv's pip where uv is
(`client_fixtures.installer`): all four took 16 s and 14 CPU-seconds on the 2-core machine (2026-12-06),
where pip took about 70 CPU-seconds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support import client_fixtures

HERE = Path(__file__).parent
ROOT = HERE.parents[2]

#: Each virtualenv's pinned packages (agent-framework needs tenacity for its MCP session, and does not pin it).
VENVS: dict[str, tuple[str, ...]] = {
    "agents": (
        "fastmcp==4.1.6",
        "openai-agents==0.24.0",
        "agent-framework-core==1.23.0",
        "mcp==2.3.0",
        "tenacity",
        "pydantic-ai-slim[mcp]==2.68.0",
    ),
    "strands": ("strands-agents==1.62.0",),
    "langchain": ("langchain-mcp-adapters==0.3.2",),
}


@dataclass(frozen=True)
class Library:
    """A client library as the suite drives it: its virtualenv, its driver (tests/support/interop/run_*.py), the
    driver's arguments before the cases."""

    title: str
    venv: str
    driver: str
    mode: tuple[str, ...] = ()


LIBRARIES: dict[str, Library] = {
    "fastmcp": Library("fastmcp 4.1.6", "agents", "run_fastmcp.py"),
    "fastmcp-tasks": Library("fastmcp 4.1.4 + fastmcp-tasks 4.1.4", "fastmcp", "run_fastmcp_tasks.py"),
    "pydantic-ai": Library("pydantic-ai-slim 2.68", "agents", "run_pydantic_ai.py"),
    "openai-agents": Library("openai-agents 0.24.0", "agents", "run_openai_agents.py"),
    "strands": Library("strands-agents 1.62.0", "strands", "run_strands.py", ("plain",)),
    "strands-tasks": Library("strands-agents 1.62.0, tasks mode", "strands", "run_strands.py", ("tasks",)),
    "agent-framework": Library("agent-framework-core 1.23.0", "agents", "run_agent_framework.py"),
    "langchain": Library("langchain-mcp-adapters 0.3.2", "langchain", "run_langchain.py"),
}


def python_of(venv: str) -> Path:
    """The interpreter of a virtualenv of the suite (`fastmcp`: the client tests' one)."""
    if venv == "fastmcp":
        return client_fixtures.PYTHON
    return ROOT / "tests" / "support" / f".venv-interop-{venv}" / "bin" / "python"


def missing(venv: str) -> str | None:
    """Why the virtualenv cannot be used (None: it can)."""
    python = python_of(venv)
    if python.exists():
        return None
    return f"{python} is missing: make it with `python -m tests.support.interop.venvs`"


def make(venv: str) -> str | None:
    """Make the virtualenv if missing; None when it is ready, else why it could not be made."""
    if venv == "fastmcp":
        return client_fixtures.make_venv(client_fixtures.VENV, client_fixtures.PACKAGES)
    return client_fixtures.make_venv(python_of(venv).parent.parent, list(VENVS[venv]))


if __name__ == "__main__":  # `python -m tests.support.interop.venvs`: make every virtualenv of the suite (.ci/run)
    failures = [reason for reason in map(make, [*VENVS, "fastmcp"]) if reason]
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1 if failures else 0)
