"""OpenID Connect sign-in on the approval page in a real browser: Debian's chromium driven with selenium.

The provider (`mcp_celery.testing.oidc_provider`, PKCE enforced) is `localhost`, the page
`127.0.0.1`: two sites, so Chromium applies SameSite cookie rules and the page's CSP (`form-action
'self'`) to the trip out and back as it does for a company's provider. bob opens the approval link,
clicks "Sign in with Test IdP", types his name on the provider's own page, comes back on the
approval, approves alice's release, and her job completes `approved by bob`; carol, signed in the
same way, gets 403 on bob's approval, then signs out: here, and at the provider (RP-initiated
logout). The sign-in page's screenshot goes to docs/images/approval-sign-in.png for the guide.
"""

from __future__ import annotations

from typing import Any

import pytest

from mcp_celery.testing.approvals import approval_path
from mcp_celery.testing.processes import wait_for
from tests.support.approval_support import Deployment, browser_fixture  # noqa: F401 - the fixture
from tests.support.harness import ROOT, HttpClient, Process
from tests.support.oidc_support import (  # noqa: F401 - the fixtures
    PROVIDER_NAME,
    Provider,
    oidc_deployment_fixture,
    oidc_worker_fixture,
    provider_fixture,
)

SCREENSHOT = ROOT / "docs" / "images" / "approval-sign-in.png"

By = pytest.importorskip("selenium.webdriver.common.by").By


def release(alice: HttpClient, version: str) -> dict[str, Any]:
    task_id = alice.start("release", {"version": version}, elicitation={"url": {}})
    task: dict[str, Any] = wait_for(
        lambda: t if (t := alice.get(task_id))["status"] == "input_required" else None, 120, 0.1, "ask"
    )
    return {**task, "taskId": task_id}


def sign_in_at_the_provider(browser: Any, link: str, person: str, screenshot: bool = False) -> None:
    """Open an approval's link signed out, take the provider's button, sign in there as `person`."""
    browser.delete_all_cookies()
    browser.get(link)
    button = browser.find_element(By.ID, "provider")
    assert button.text == f"Sign in with {PROVIDER_NAME}"
    if screenshot:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
    button.click()
    wait_for(lambda: browser.find_elements(By.NAME, "sub"), 30, 0.1, "the provider's own sign-in page")
    assert browser.current_url.startswith("http://localhost:"), browser.current_url  # the other site
    browser.find_element(By.NAME, "sub").send_keys(person)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    # Back on the page: the callback's page moves on to the approval by itself (a same-site navigation).
    wait_for(lambda: browser.current_url == link, 30, 0.1, f"back on {link}")


def test_bob_signs_in_at_the_provider_in_chromium_and_approves_and_carol_is_refused(
    oidc_deployment: Deployment, provider: Provider, oidc_worker: Process, browser: Any
) -> None:
    alice = oidc_deployment.client("alice")
    first = release(alice, "4.0.0")
    link = oidc_deployment.base + approval_path(first)
    assert first["inputRequests"]["approval-1"]["params"]["url"] == link
    before = provider.pkce()

    sign_in_at_the_provider(browser, link, "bob", screenshot=True)
    wait_for(lambda: "Approval requested" in browser.page_source, 30, 0.1, "the approval, signed in")
    assert "bob" in browser.find_element(By.TAG_NAME, "header").text
    (session,) = [c for c in browser.get_cookies() if c["name"] == "mcp_celery_approvals"]
    assert session["secure"] and session["httpOnly"] and session["sameSite"] == "Strict", session
    assert not [c for c in browser.get_cookies() if c["name"] == "mcp_celery_oidc"]  # the attempt's cookie is gone
    assert provider.pkce()["checked"] == before["checked"] + 1 and provider.pkce()["refused"] == before["refused"]
    browser.find_element(By.ID, "comment").send_keys("signed in at the company's provider")
    browser.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_for(lambda: "Approved by bob" in browser.page_source, 30, 0.1, "the decision shown")
    done = alice.wait(first["taskId"], timeout=120)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"]["decision"] == "approved by bob: signed in at the company's provider"

    second = release(alice, "4.0.1")
    link = oidc_deployment.base + approval_path(second)
    sign_in_at_the_provider(browser, link, "carol")
    assert "Not yours to decide" in browser.page_source and "not one of the approvers" in browser.page_source
    assert "carol" in browser.find_element(By.TAG_NAME, "header").text
    assert not browser.find_elements(By.CSS_SELECTOR, "button.approve")
    assert alice.get(second["taskId"])["status"] == "input_required"

    # Sign-out: the session ends here, then the browser goes on to the provider's end-session page and back.
    browser.find_element(By.CSS_SELECTOR, "header form button").click()
    wait_for(lambda: "/oauth2/end_session" in browser.current_url, 30, 0.1, "the provider's end-session page")
    assert browser.current_url.startswith(provider.issuer) and "id_token_hint=" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(lambda: browser.current_url == f"{oidc_deployment.base}/approvals", 30, 0.1, "back on the page")
    wait_for(lambda: browser.find_elements(By.ID, "provider"), 30, 0.1, "the sign-in page")
    browser.get(link)
    assert browser.find_elements(By.ID, "provider") and "carol" not in browser.page_source
    alice.result("tasks/cancel", {"taskId": second["taskId"]})
    alice.close()
