"""The approval rules and edge helpers as pure functions: who may decide, the approvers list, what the
page shows of the arguments, CSRF tokens, the Host check, revoking tokens, who may read /metrics.

No services: the end-to-end behaviour is in `tests/server/approvals/test_approval_security.py` and
`tests/server/approvals/test_approvals.py`.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import Headers

from mcp_celery.core.approvals import approval_request, may_decide, named_approvers, redacted_arguments
from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import hide_secrets
from mcp_celery.server.approvals.session import FormKeys
from mcp_celery.server.edge import hosts
from mcp_celery.server.edge.tokens import new_token, parse_token_file, revoke_tokens
from mcp_celery.server.ops.operations import metrics_access
from mcp_celery.settings import Settings


def request(approvers: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"approval_id": "x" * 32, "approvers": approvers, "four_eyes": True, "details": None}
    fields.update(arguments={}, requester="alice", **kw)
    built = approval_request("Go?", "https://jobs.example/approvals/x", **fields)
    return dict(built["params"]["_meta"]["mcp-celery/approval"])


def test_the_requester_never_decides_unless_four_eyes_is_explicitly_false() -> None:
    assert may_decide(request(), "alice") is not None
    assert may_decide(request(["alice", "bob"]), "alice") is not None
    assert may_decide({"approvers": None, "requester": "alice"}, "alice") is not None  # no key: four eyes too
    assert may_decide(request(["alice"], four_eyes=False), "alice") is None
    assert may_decide(request(), "bob") is None and may_decide(request(["bob"]), "carol") is not None
    assert may_decide(request(), "") is not None


@pytest.mark.parametrize("given", ["bob", b"bob", {"bob": 1}, 7, ["bob", 7], ["bob", ""]])
def test_approvers_must_be_a_list_of_principal_names(given: Any) -> None:
    with pytest.raises(TypeError, match="approvers must be"):
        named_approvers(given)


def test_approvers_are_kept_sorted_once_each_and_an_empty_list_names_nobody() -> None:
    assert named_approvers(["carol", "bob", "carol"]) == ["bob", "carol"]
    assert named_approvers(("bob",)) == ["bob"] and named_approvers(None) is None
    with pytest.raises(ValueError, match="names nobody"):
        named_approvers([])
    with pytest.raises(TypeError, match=r"approvers=\['bob'\]"):  # the error shows the fix
        approval_request("Go?", "u", approval_id="x", approvers="bob", four_eyes=True, details=None, arguments={},
                         requester="alice")  # fmt: skip


def test_secret_looking_keys_are_hidden_at_any_depth_and_long_strings_cut() -> None:
    shown = redacted_arguments(
        {
            "config": {"db_password": "pw1", "host": "db", "nested": [{"api_key": "pw2", "ok": 1}]},
            "url": "redis://:pw3@h/0",
            "long": "x" * 500,
            "token": {"anything": "pw4"},
        }
    )
    assert "pw" not in repr(shown), shown
    assert shown["config"]["host"] == "db" and shown["config"]["nested"][0] == {"api_key": "***", "ok": 1}
    assert shown["token"] == "***" and shown["url"] == "redis://:***@h/0" and len(shown["long"]) == 201
    assert hide_secrets({"AuthHeader": "x", "n": None, "f": 1.5, "t": (1, "a")}) == {
        "AuthHeader": "***",
        "n": None,
        "f": 1.5,
        "t": [1, "a"],
    }


def test_csrf_tokens_compare_as_bytes_so_any_text_is_refused_without_an_error() -> None:
    keys = FormKeys(b"s" * 32)
    token = keys.csrf("nonce", "/approvals/x")
    assert keys.csrf_ok("nonce", "/approvals/x", token)
    for wrong in ("\u00e9t\u00e9", token + "\u00e9", "", None, 7):
        assert not keys.csrf_ok("nonce", "/approvals/x", wrong)
    assert not keys.csrf_ok("other", "/approvals/x", token) and not keys.csrf_ok("nonce", "/approvals/y", token)
    assert not keys.csrf_ok(None, "/approvals/x", token)


def test_the_host_check_allows_loopback_and_the_configured_names_only() -> None:
    check = hosts.HostCheck(None, Settings(allowed_hosts="jobs.example.com"))  # type: ignore[arg-type]

    def status(**headers: str) -> int | None:
        refused = check.refusal(Headers(headers))
        return None if refused is None else refused[0]

    assert status(host="127.0.0.1:8000") is None and status(host="[::1]:8000") is None
    assert status(host="jobs.example.com", origin="https://jobs.example.com") is None
    assert status(host="jobs.example.com:8443", origin="https://jobs.example.com:8443") is None
    assert status(host="127.0.0.1:8000.attacker.example") == 421  # a port, not a longer name
    assert status(host="attacker.example") == 421 and status() == 421
    assert status(host="127.0.0.1:8000", origin="http://attacker.example") == 403
    assert status(host="127.0.0.1:8000", origin="null") == 403
    off = hosts.HostCheck(None, Settings(allowed_hosts="*"))  # type: ignore[arg-type]
    assert off.refusal(Headers({"host": "anything"})) is None


def test_revoking_removes_every_line_of_the_principal_and_keeps_the_file_private(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    for name in ("alice", "bob", "alice"):
        new_token(name, path)
    path.write_text("# the team\n" + path.read_text())
    assert revoke_tokens("alice", path) == 2
    assert [name for name, _ in parse_token_file(path.read_text())] == ["bob"]
    assert path.read_text().startswith("# the team\n") and stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ConfigurationError, match="no token of 'alice'"):
        revoke_tokens("alice", path)
    with pytest.raises(ConfigurationError, match="cannot rewrite"):
        revoke_tokens("bob", tmp_path / "absent")


def test_the_startup_line_says_who_may_read_metrics() -> None:
    assert metrics_access(Settings()) == "/metrics open, no authentication configured"
    assert metrics_access(Settings(auth_tokens="/x")) == "/metrics needs a bearer token"
    assert metrics_access(Settings(jwt_jwks="/x", metrics_token="t")) == "/metrics needs MCP_CELERY_METRICS_TOKEN"
    assert metrics_access(Settings(metrics_port=9100)).startswith("/metrics on port 9100 open")
    assert metrics_access(Settings(metrics=False)) == "no /metrics"
