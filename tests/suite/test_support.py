"""The suite's own rules: a test that needs a service CI provides never skips in CI, and the suite
flushes only a Redis it started itself or was told to use."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.testing.processes import redis_answers, start_redis
from tests.support.harness import REQUIRE_ENV, ROOT, live_processes, require_service, tcp_unavailable, wait_for


def outcome(service: str, unavailable: str | None) -> tuple[str, str]:
    """What `require_service` made of it: ("run", ""), ("skip", why) or ("fail", why)."""
    try:
        require_service(service, unavailable)
    except pytest.skip.Exception as skipped:
        return "skip", str(skipped.msg)
    except pytest.fail.Exception as failed:
        return "fail", str(failed.msg)
    return "run", ""


def test_a_missing_service_skips_the_test_unless_the_run_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert outcome("rabbitmq", None) == ("run", "")
    assert outcome("rabbitmq", "nothing answers") == ("skip", "needs rabbitmq: nothing answers")
    monkeypatch.setenv(REQUIRE_ENV, "fastmcp rabbitmq")
    assert outcome("rabbitmq", None) == ("run", "")
    required = f"rabbitmq is required ({REQUIRE_ENV}) but nothing answers"
    assert outcome("rabbitmq", "nothing answers") == ("fail", required)
    assert outcome("postgresql", "nothing answers") == ("skip", "needs postgresql: nothing answers")  # not required


def test_a_port_is_available_only_while_something_listens_on_it() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert tcp_unavailable("127.0.0.1", port) is None
    listener.close()
    reason = tcp_unavailable("127.0.0.1", port)
    assert reason is not None and reason.startswith(f"nothing answers on 127.0.0.1:{port}"), reason


#: The settings that point the suite at a Redis (conftest's module docstring).
REDIS_SETTINGS = ("MCP_CELERY_TEST_REDIS", "TEST_BROKER_URL", "TEST_RESULT_BACKEND")
#: A process that loads the suite's conftest as a session does, writes the Redis settings it ended
#: with to argv[1], and exits (stopping what the session started) when its stdin closes.
LOAD_CONFTEST = (
    "import json, os, sys; import tests.conftest; "
    f"open(sys.argv[1], 'w').write(json.dumps({{k: os.environ[k] for k in {REDIS_SETTINGS!r}}})); sys.stdin.read()"
)


def redis_servers_started_by(pid: int) -> list[int]:
    return [child for child, name, parent, _ in live_processes() if parent == pid and name == "redis-server"]


def session_start(tmp_path: Path, **redis: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A session's conftest loaded with only `redis` of REDIS_SETTINGS set; returns it, running, and what it chose."""
    blank = {"MCP_CELERY_TEST_STORE", "TEST_CELERY_BACKEND", "MCP_CELERY_REDIS_URL", *REDIS_SETTINGS}
    env = {**{k: v for k, v in os.environ.items() if k not in blank}, **redis}
    report = tmp_path / f"chosen-{len(redis)}.json"
    session = subprocess.Popen(
        [sys.executable, "-c", LOAD_CONFTEST, str(report)], cwd=ROOT, env=env, stdin=subprocess.PIPE
    )
    chosen = wait_for(lambda: report.exists() and report.read_text(), 60, 0.05, "the session to choose its Redis")
    return session, json.loads(chosen)


def end(session: subprocess.Popen[bytes]) -> None:
    assert session.stdin is not None
    session.stdin.close()
    assert session.wait(timeout=30) == 0


def test_the_suite_starts_a_redis_server_of_its_own_unless_one_is_named(tmp_path: Path) -> None:
    session, chosen = session_start(tmp_path)
    try:
        own = chosen["MCP_CELERY_TEST_REDIS"]
        assert own != "redis://127.0.0.1:6379" and redis_answers(own), chosen
        assert (chosen["TEST_BROKER_URL"], chosen["TEST_RESULT_BACKEND"]) == (f"{own}/12", f"{own}/13")
        assert len(redis_servers_started_by(session.pid)) == 1  # the server behind `own`, the session's own
    finally:
        end(session)
    wait_for(lambda: not redis_answers(own), 20, 0.05, "the session's redis-server to stop with it")

    users, server = start_redis(tmp_path / "users-redis.log")  # a Redis the run is told to use, by name
    try:
        session, chosen = session_start(tmp_path, MCP_CELERY_TEST_REDIS=users)
        try:
            assert chosen == {"MCP_CELERY_TEST_REDIS": users, "TEST_BROKER_URL": f"{users}/12",
                              "TEST_RESULT_BACKEND": f"{users}/13"}  # fmt: skip
            assert redis_servers_started_by(session.pid) == []
        finally:
            end(session)
    finally:
        server.stop()


def test_the_longest_files_handed_out_first_exist() -> None:
    """A file renamed or moved would drop out of the order silently: its session might run it last again."""
    from tests.conftest import LONGEST_FILES

    assert [path for path in LONGEST_FILES if not (ROOT / path).is_file()] == []
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
