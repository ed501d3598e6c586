"""Signing in on the approval page with OpenID Connect, against a real provider on loopback.

The provider (`mcp_celery.testing.oidc_provider`: PyPI's oidc-provider-mock behind a PKCE check) is
`localhost`, the page `127.0.0.1`; a real `mcp-celery serve --http`, a real prefork worker and a
private Redis. The page is driven as a browser without JavaScript drives it (cookies and redirects by
hand, `PageClient`); `tests/server/approvals/test_approval_browser_oidc.py` does it in Chromium.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from html import escape, unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from mcp_celery.errors import ConfigurationError
from mcp_celery.server.approvals.oidc import oidc_config
from mcp_celery.settings import Settings
from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.oidc_provider import SHORT_LIVED_S
from mcp_celery.testing.processes import free_port, wait_for
from tests.support.approval_support import Deployment, deployed
from tests.support.harness import ROOT, Process
from tests.support.oidc_support import (  # noqa: F401 - the fixtures
    CLIENT_ID,
    PROVIDER_NAME,
    Provider,
    oidc_deployment_fixture,
    oidc_settings,
    oidc_worker_fixture,
    provider_fixture,
)


@pytest.fixture
def page(oidc_deployment: Deployment) -> Iterator[PageClient]:
    client = PageClient(oidc_deployment.base)
    yield client
    client.close()


def server_log(deployment: Deployment) -> str:
    assert deployment.server is not None
    return deployment.server.output()


def logged(deployment: Deployment, text: str) -> str:
    """Wait for a line of the server's log that holds `text`; returns it."""

    def line() -> str | None:
        return next((x for x in server_log(deployment).splitlines() if text in x), None)

    return wait_for(line, 15, 0.05, f"a server log line with {text!r}")


def test_bob_signs_in_at_the_provider_approves_alices_release_and_carol_is_refused(
    oidc_deployment: Deployment, provider: Provider, oidc_worker: Process
) -> None:
    alice = oidc_deployment.client("alice")
    task_id = alice.start("release", {"version": "3.0.0"}, elicitation={"url": {}})
    task = wait_for(lambda: t if (t := alice.get(task_id))["status"] == "input_required" else None, 120, 0.1, "ask")
    path = approval_path(task)
    before = provider.pkce()

    bob = PageClient(oidc_deployment.base)
    sign_in = bob.get(path)
    assert sign_in.status_code == 200 and f"Sign in with {PROVIDER_NAME}" in sign_in.text, sign_in.text
    signed_in = bob.sign_in_with_provider("bob", path)
    assert signed_in.status_code == 200 and "Signed in as bob" in signed_in.text, signed_in.text
    assert f'url={path}"' in signed_in.text  # on to the approval asked for, by a navigation of the page itself
    session = next(h for h in signed_in.headers.get_list("set-cookie") if h.startswith("mcp_celery_approvals="))
    assert "SameSite=Strict" in session and "HttpOnly" in session and "Secure" in session, session
    assert bob.decide(path, "approve", "signed in at the provider").status_code == 303
    done = alice.wait(task_id, timeout=120)
    assert done["result"]["structuredContent"]["decision"] == "approved by bob: signed in at the provider", done
    after = provider.pkce()
    assert after["checked"] == before["checked"] + 1 and after["refused"] == before["refused"], (before, after)

    second = alice.start("release", {"version": "3.0.1"}, elicitation={"url": {}})
    second_path = approval_path(
        wait_for(lambda: t if (t := alice.get(second))["status"] == "input_required" else None, 120, 0.1, "ask")
    )
    carol = PageClient(oidc_deployment.base)
    assert carol.sign_in_with_provider("carol", second_path).status_code == 200
    refused = carol.get(second_path)
    assert refused.status_code == 403 and "not one of the approvers" in refused.text, refused.text
    assert alice.get(second)["status"] == "input_required"
    alice.result("tasks/cancel", {"taskId": second})
    for client in (bob, carol, alice):
        client.close()


def test_the_token_endpoint_refuses_a_wrong_pkce_verifier_and_the_page_sends_the_right_one(
    oidc_deployment: Deployment, provider: Provider, page: PageClient
) -> None:
    authorization = page.to_provider()
    asked = parse_qs(urlsplit(authorization).query)
    assert asked["code_challenge_method"] == ["S256"] and len(asked["code_challenge"][0]) == 43, asked
    callback = page.at_provider(authorization, "bob")
    code = parse_qs(urlsplit(callback).query)["code"][0]
    before = provider.pkce()
    token_endpoint = provider.metadata()["token_endpoint"]
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": callback.split("?")[0]}
    guessed = httpx.post(token_endpoint, data={**form, "code_verifier": "x" * 43}, auth=(CLIENT_ID, "s"), timeout=10)
    assert guessed.status_code == 400 and guessed.json()["error"] == "invalid_grant", guessed.text
    assert provider.pkce() == {"checked": before["checked"] + 1, "refused": before["refused"] + 1}
    # The same code, brought back to the page: the page's own exchange sends the verifier that matches.
    back = page.back_from_provider(callback)
    assert back.status_code == 200 and "Signed in as bob" in back.text, back.text
    assert provider.pkce() == {"checked": before["checked"] + 2, "refused": before["refused"] + 1}


def test_a_replayed_state_is_refused_and_logged(oidc_deployment: Deployment, page: PageClient) -> None:
    callback = page.at_provider(page.to_provider(), "bob")
    assert page.back_from_provider(callback).status_code == 200
    replayed = page.back_from_provider(callback)
    assert replayed.status_code == 400 and "expired or was already used" in replayed.text, replayed.text
    assert "mcp_celery_approvals=" not in " ".join(replayed.headers.get_list("set-cookie"))
    logged(oidc_deployment, "refused (400): callback with an unknown, expired or replayed state")


def test_a_callback_without_state_or_from_another_browser_is_refused(
    oidc_deployment: Deployment, page: PageClient
) -> None:
    callback = page.at_provider(page.to_provider(), "bob")
    code = parse_qs(urlsplit(callback).query)["code"][0]
    missing = page.get("/approvals/oidc/callback?" + urlencode({"code": code}))
    assert missing.status_code == 400 and "no state" in missing.text, missing.text
    logged(oidc_deployment, "refused (400): callback without state")
    # The attacker's own attempt, completed in the victim's browser (login CSRF): the binding differs.
    victim = PageClient(oidc_deployment.base)
    foreign = victim.back_from_provider(callback)
    assert foreign.status_code == 400 and "another browser" in foreign.text, foreign.text
    assert not any(h.startswith("mcp_celery_approvals=") for h in foreign.headers.get_list("set-cookie"))
    logged(oidc_deployment, "callback from another browser")
    victim.close()


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("other-key", "BadSignatureError"),
        ("audience", "'aud'"),
        ("expired", "ExpiredTokenError"),
        ("nonce", "'nonce'"),
    ],
)
def test_an_id_token_that_fails_a_check_is_refused_with_403_and_a_log_line(
    oidc_deployment: Deployment, provider: Provider, page: PageClient, mode: str, reason: str
) -> None:
    callback = page.at_provider(page.to_provider(), "bob")
    provider.tamper(mode)
    refused = page.back_from_provider(callback)
    assert refused.status_code == 403 and "not accepted" in refused.text, refused.text
    assert not any(h.startswith("mcp_celery_approvals=") for h in refused.headers.get_list("set-cookie"))
    line = logged(oidc_deployment, "ID token refused: ")
    assert reason in logged(oidc_deployment, reason), line
    assert page.get("/approvals").text.count("Sign in with") == 1  # still signed out


def test_an_id_token_resigned_by_a_listed_key_is_accepted(
    oidc_deployment: Deployment, provider: Provider, page: PageClient
) -> None:
    """The control of the test above: the altered tokens fail for their fault, not for being altered."""
    callback = page.at_provider(page.to_provider(), "bob")
    provider.tamper("resigned")
    accepted = page.back_from_provider(callback)
    assert accepted.status_code == 200 and "Signed in as bob" in accepted.text, accepted.text


def test_a_provider_error_is_shown_escaped(oidc_deployment: Deployment, page: PageClient) -> None:
    authorization = page.to_provider()
    with httpx.Client(timeout=30) as browser:
        denied = browser.post(authorization, data={"action": "deny"})
    assert denied.status_code == 302, denied.text
    shown = page.back_from_provider(denied.headers["location"])  # the mock's denial carries no state
    assert shown.status_code == 400 and f"{PROVIDER_NAME} did not sign you in: access_denied" in shown.text
    logged(oidc_deployment, "provider answered access_denied without state")
    crafted = {"error": "access_denied", "error_description": "Call +1 555 0100 to unlock your account"}
    shown = page.get("/approvals/oidc/callback?" + urlencode(crafted))
    assert shown.status_code == 400 and "access_denied" in shown.text and "555" not in shown.text, shown.text
    state = parse_qs(urlsplit(page.to_provider()).query)["state"][0]
    hostile = {"state": state, "error": "<script>alert(1)</script>", "error_description": '<img src=x onerror="y">'}
    shown = page.get("/approvals/oidc/callback?" + urlencode(hostile))
    assert shown.status_code == 400 and "<script>" not in shown.text and "<img" not in shown.text, shown.text
    assert escape("<script>alert(1)</script>") in shown.text and escape('<img src=x onerror="y">') in shown.text
    logged(oidc_deployment, "provider answered <script>")


def test_an_unreachable_provider_is_a_warning_the_page_says_so_and_mcp_is_served(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("oidc-unreachable")
    nowhere = f"http://localhost:{free_port()}"
    with deployed(env, folder, oidc_settings(nowhere, folder)) as deployment:
        logged(deployment, f"cannot use the OpenID Connect provider {nowhere}")
        page = PageClient(deployment.base)
        shown = page.get("/approvals")
        assert shown.status_code == 200 and f"Sign-in with {PROVIDER_NAME} is unavailable" in shown.text
        assert 'id="token"' in shown.text  # the token form still signs people in
        start = page.get("/approvals/oidc/start")
        assert start.status_code == 503 and "unavailable" in start.text, start.text
        alice = deployment.client("alice")
        assert "release" in [tool["name"] for tool in alice.result("tools/list", {})["tools"]]
        alice.close()
        page.close()


def test_with_the_token_form_hidden_an_approval_link_goes_straight_to_the_provider_and_back(
    env: dict[str, str], provider: Provider, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("oidc-only")
    limit = {"MCP_CELERY_APPROVAL_SIGN_IN_LIMIT": "3"}
    settings = oidc_settings(provider.issuer, folder, MCP_CELERY_APPROVAL_TOKEN_SIGN_IN="false", **limit)
    with deployed(env, folder, settings) as deployment:
        page = PageClient(deployment.base)
        assert 'id="token"' not in page.get("/approvals").text
        link = "/approvals/an-approval-id-from-a-webhook-or-an-elicitation"
        sent = page.get(link)
        assert sent.status_code == 303 and sent.headers["location"].startswith(f"{provider.issuer}/oauth2/authorize")
        back = page.back_from_provider(page.at_provider(sent.headers["location"], "bob"))
        assert back.status_code == 200 and f'url={link}"' in back.text, back.text
        assert page.get(link).status_code == 404  # signed in: the page itself (no such approval here)
        # A completed sign-in counted nothing; starts left unfinished do count, so none can fill Redis.
        other = PageClient(deployment.base)
        assert [other.get(link).status_code for _ in range(4)] == [303, 303, 303, 429]
        other.close()
        page.close()


def test_the_client_secret_is_read_from_its_file_and_never_logged(oidc_deployment: Deployment) -> None:
    secret = Path(oidc_deployment.env["MCP_CELERY_OIDC_CLIENT_SECRET_FILE"]).read_text().strip()
    assert not any(secret in value for value in oidc_deployment.env.values())  # only the file's path is a setting
    logged(oidc_deployment, f"the approval page signs people in with {PROVIDER_NAME}")  # the settings were used
    assert secret not in server_log(oidc_deployment)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"oidc_client_id": None}, "MCP_CELERY_OIDC_CLIENT_ID is not"),
        ({"oidc_issuer": "http://idp.example"}, "must be an https:// URL"),
        ({"oidc_scopes": "email profile"}, "must include openid"),
        ({"oidc_client_secret_file": "/nonexistent/secret"}, "cannot read MCP_CELERY_OIDC_CLIENT_SECRET_FILE"),
    ],
)
def test_incomplete_or_unsafe_oidc_settings_refuse_to_start(settings: dict[str, Any], refusal: str) -> None:
    good = {"oidc_issuer": "https://idp.example/realms/x", "oidc_client_id": "page", **settings}
    with pytest.raises(ConfigurationError, match=refusal):
        oidc_config(Settings(**good), "https://jobs.example/mcp")


def test_the_redirect_uri_is_the_pages_beside_the_public_url() -> None:
    config = oidc_config(
        Settings(oidc_issuer="https://idp.example/", oidc_client_id="page"), "https://jobs.example/mcp"
    )
    assert config is not None and config.redirect_uri == "https://jobs.example/approvals/oidc/callback"
    assert config.issuer == "https://idp.example" and config.provider_name == "idp.example"
    assert config.client_secret is None and config.principal_claim == "sub"
    assert oidc_config(Settings(), "https://jobs.example/mcp") is None


def test_the_demo_with_oidc_has_bob_sign_in_at_the_provider(env: dict[str, str]) -> None:
    demo = {k: v for k, v in env.items() if not k.startswith(("CELERY_", "MCP_CELERY_"))}
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "demo", "--oidc", "--port", str(free_port())],
        cwd=ROOT, env=demo, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"OpenID Connect provider: http://localhost:\d+ ", out.stdout), out.stdout
    assert "(bob signs in at the OpenID Connect provider, typing his name on its page)" in out.stdout
    assert "result: approved by bob: digest checked" in out.stdout, out.stdout


def test_sign_out_ends_the_session_here_and_sends_the_person_to_the_provider_to_end_theirs(
    oidc_deployment: Deployment, provider: Provider, page: PageClient
) -> None:
    assert page.sign_in_with_provider("bob").status_code == 200
    kept = dict(page.cookies)  # the session cookie as a thief would hold it
    listed = page.get("/approvals")
    assert listed.status_code == 200 and "Waiting for your decision" in listed.text
    out = page.post("/approvals/sign-out", {"csrf": csrf_of(listed.text, "/approvals/sign-out")})
    assert out.status_code == 200 and "Signed out here" in out.text, out.text
    to_provider = re.search(r'url=([^"]+)"', out.text)
    assert to_provider is not None
    end_session = unescape(to_provider[1])
    assert end_session.startswith(provider.metadata()["end_session_endpoint"] + "?"), end_session
    asked = parse_qs(urlsplit(end_session).query)
    assert asked["client_id"] == [CLIENT_ID] and asked["post_logout_redirect_uri"] == [
        f"{oidc_deployment.base}/approvals"
    ]
    assert asked["id_token_hint"][0].count(".") == 2  # the ID token the session was opened with
    # Ended on the server: the old cookie opens nothing, in this browser or any other.
    thief = PageClient(oidc_deployment.base)
    thief.cookies.update(kept)
    assert "Sign in with" in thief.get("/approvals").text
    thief.close()
    # The provider's end-session page takes the hint and sends the person back to the page.
    with httpx.Client(timeout=30) as browser:
        shown = browser.get(end_session)
        assert shown.status_code == 200, shown.text
        back = browser.post(
            f"{provider.issuer}/oauth2/end_session/confirm", data={"redirect_uri": asked["post_logout_redirect_uri"][0]}
        )
    assert back.status_code == 302 and back.headers["location"] == f"{oidc_deployment.base}/approvals"


def test_a_session_ends_with_its_id_token_and_a_decision_after_that_is_refused(
    oidc_deployment: Deployment, provider: Provider, oidc_worker: Process
) -> None:
    alice = oidc_deployment.client("alice")
    task_id = alice.start("release", {"version": "3.1.0"}, elicitation={"url": {}})
    path = approval_path(
        wait_for(lambda: t if (t := alice.get(task_id))["status"] == "input_required" else None, 120, 0.1, "ask")
    )
    bob = PageClient(oidc_deployment.base)
    callback = bob.at_provider(bob.to_provider(path), "bob")
    provider.tamper("short-lived")
    signed_in = bob.back_from_provider(callback)
    assert signed_in.status_code == 200, signed_in.text
    session = next(h for h in signed_in.headers.get_list("set-cookie") if h.startswith("mcp_celery_approvals="))
    found = re.search(r"Max-Age=(\d+)", session)
    assert (
        found is not None and int(found[1]) <= SHORT_LIVED_S
    )  # the ID token's life, not MCP_CELERY_APPROVAL_SESSION_S
    ends = time.time() + int(found[1])
    form = bob.get(path)
    assert form.status_code == 200 and "Approve" in form.text  # signed in, for now
    # Once the ID token's exp has passed, the same session's decision is refused and nothing is decided.
    wait_for(lambda: time.time() > ends + 1, SHORT_LIVED_S + 10, 0.1, "the ID token's exp to pass")
    refused = bob.post(path, {"csrf": csrf_of(form.text, path), "decision": "approve"})
    assert refused.status_code == 401, refused.text
    assert "Sign in to decide" in refused.text
    assert alice.get(task_id)["status"] == "input_required"
    alice.result("tasks/cancel", {"taskId": task_id})
    bob.close()
    alice.close()
