"""The suite's own rules about what a run proves: a test that needs a service CI provides never skips in CI."""

from __future__ import annotations

import socket

import pytest

from tests.support import REQUIRE_ENV, require_service, tcp_unavailable


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
