"""Settings that cannot be read stop the server and the worker with one line per variable, not pydantic's dump."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mcp_celery.errors import ConfigurationError
from mcp_celery.settings import Settings
from tests.support.harness import ROOT


def test_each_unreadable_setting_is_named_by_its_variable_with_what_it_must_be(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_CELERY_INLINE_S", "soon")
    monkeypatch.setenv("MCP_CELERY_REDIS_MIN_REPLICAS", "-1")
    with pytest.raises(ConfigurationError) as raised:
        Settings()
    message = str(raised.value)
    assert "MCP_CELERY_INLINE_S='soon': Input should be a valid number" in message
    assert "MCP_CELERY_REDIS_MIN_REPLICAS='-1': Input should be greater than or equal to 0" in message
    assert "\n" not in message and "pydantic.dev" not in message


def test_serve_with_an_unreadable_setting_exits_2_with_one_line(env: dict[str, str]) -> None:
    bad = {**env, "MCP_CELERY_INLINE_S": "soon"}
    done = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"],
        env=bad, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        "mcp-celery: MCP_CELERY_INLINE_S='soon': Input should be a valid number, unable to parse string as a number"
    ], done.stderr
