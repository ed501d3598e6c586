"""The approval page in a real browser: Debian's chromium driven with selenium (chromium-driver).

bob signs in, finds alice's pending `release` in his list, approves it with a comment, and alice's
task completes `approved by bob` with the comment and the artifact published; bob denies the next
one; carol (not named) gets 403; alice, who asked, cannot approve her own (four eyes); a form post
of bob's session replayed without its CSRF token or with a forged one, and a second decision, are
refused. The approval page's screenshot goes to docs/images/approval-page.png for the guide. The
approval policy's path: a call of a tool the policy holds (`approval_support.POLICY`) is decided on
the same page, its screenshot docs/images/approval-policy.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.processes import wait_for
from tests.support.approval_support import (  # noqa: F401 - fixtures
    Deployment,
    approval_worker_fixture,
    browser_fixture,
    deployment_fixture,
)
from tests.support.harness import ROOT, HttpClient, Process

SCREENSHOT = ROOT / "docs" / "images" / "approval-page.png"
POLICY_SCREENSHOT = ROOT / "docs" / "images" / "approval-policy.png"

webdriver = pytest.importorskip("selenium.webdriver")
By = pytest.importorskip("selenium.webdriver.common.by").By


def sign_in(browser: Any, base: str, token: str) -> None:
    browser.delete_all_cookies()
    browser.get(f"{base}/approvals")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/approvals/sign-in'] button").click()
    wait_for(lambda: "Waiting for your decision" in browser.page_source, 30, 0.1, "the list after sign-in")


def release(alice: HttpClient, version: str) -> tuple[str, dict[str, Any]]:
    task_id = alice.start("release", {"version": version}, elicitation={"url": {}})
    task = wait_for(lambda: t if (t := alice.get(task_id))["status"] == "input_required" else None, 120, 0.1, "ask")
    return task_id, task


def test_bob_approves_alices_release_in_a_browser_and_the_rules_hold(
    deployment: Deployment, approval_worker: Process, browser: Any
) -> None:
    alice = deployment.client("alice")
    base = deployment.base
    first_id, first = release(alice, "2.0.0")
    second_id, second = release(alice, "2.0.1")

    # Secure, HttpOnly, SameSite=Strict cookies over http://127.0.0.1: the browser keeps them.
    sign_in(browser, base, deployment.tokens["bob"])
    (session,) = [c for c in browser.get_cookies() if c["name"] == "mcp_celery_approvals"]
    assert session["secure"] and session["httpOnly"] and session["sameSite"] == "Strict", session
    assert "Publish mcp-celery 2.0.0?" in browser.page_source and "Publish mcp-celery 2.0.1?" in browser.page_source
    browser.find_element(By.PARTIAL_LINK_TEXT, "Publish mcp-celery 2.0.0?").click()
    wait_for(lambda: "Approval requested" in browser.page_source, 30, 0.1, "the approval page")
    sha256 = first["inputRequests"]["approval-1"]["params"]["_meta"]["mcp-celery/approval"]["details"]["sha256"]
    assert sha256 in browser.page_source and "alice" in browser.page_source
    browser.find_element(By.ID, "comment").send_keys("digest checked against the build log")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))
    browser.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_for(lambda: "Approved by bob" in browser.page_source, 30, 0.1, "the decision shown")
    assert browser.find_elements(By.CSS_SELECTOR, "button.approve") == []  # one decision only

    done = alice.wait(first_id, timeout=120)
    report = done["result"]["structuredContent"]
    assert (
        done["status"] == "completed" and report["decision"] == "approved by bob: digest checked against the build log"
    )
    assert Path(report["published"]).read_bytes() and report["digest"] == sha256

    # The second release: carol is not named, alice asked it (four eyes), a replay without CSRF is refused.
    path = approval_path(second)
    sign_in(browser, base, deployment.tokens["carol"])
    browser.get(base + path)
    assert "Not yours to decide" in browser.page_source and "not one of the approvers" in browser.page_source
    sign_in(browser, base, deployment.tokens["alice"])
    browser.get(base + path)
    assert "four eyes" in browser.page_source and not browser.find_elements(By.CSS_SELECTOR, "button.approve")
    sign_in(browser, base, deployment.tokens["bob"])
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    replay = PageClient(base)
    replay.cookies.update(cookies)
    refused = replay.post(path, {"decision": "approve", "comment": "replayed"})
    assert refused.status_code == 403 and "CSRF" in refused.text
    browser.get(base + path)
    token = csrf_of(browser.page_source.replace("&amp;", "&"), path)
    # bob is an allowed approver: a token of another form of his session, or one letter off, is still refused.
    off_by_one = token[:-1] + ("A" if token[-1] != "A" else "B")
    for forged in (csrf_of(browser.page_source.replace("&amp;", "&"), "/approvals/sign-out"), off_by_one):
        refused = replay.post(path, {"decision": "approve", "comment": "forged", "csrf": forged})
        assert refused.status_code == 403 and "CSRF" in refused.text, forged
    assert alice.get(second_id)["status"] == "input_required"
    browser.find_element(By.ID, "comment").send_keys("wrong branch")
    browser.find_element(By.CSS_SELECTOR, "button.deny").click()
    wait_for(lambda: "Denied by bob" in browser.page_source, 30, 0.1, "the denial shown")
    again = replay.post(path, {"csrf": token, "decision": "approve", "comment": "changed my mind"})
    assert again.status_code == 409 and "Denied by bob" in again.text
    denied = alice.wait(second_id, timeout=120)
    assert denied["result"]["structuredContent"]["decision"] == "denied by bob: wrong branch"
    assert denied["result"]["structuredContent"]["published"] is None
    replay.close()
    alice.close()


def test_bob_decides_calls_the_approval_policy_held_in_a_browser(
    deployment: Deployment, approval_worker: Process, browser: Any
) -> None:
    alice = deployment.client("alice")
    approved_id = alice.start("deploy_docs", {"service": "site", "env": "prod"}, elicitation={"url": {}})
    denied_id = alice.start("deploy_docs", {"service": "site", "env": "staging"}, elicitation={"url": {}})
    held = alice.wait(approved_id, ["input_required"], timeout=30)
    digest = held["inputRequests"]["policy-approval"]["params"]["_meta"]["mcp-celery/approval"]["details"]

    sign_in(browser, deployment.base, deployment.tokens["bob"])
    assert "Deploy site to prod?" in browser.page_source and "Deploy site to staging?" in browser.page_source
    browser.find_element(By.PARTIAL_LINK_TEXT, "Deploy site to prod?").click()
    wait_for(lambda: "Approval requested" in browser.page_source, 30, 0.1, "the approval page")
    assert "deploy_docs" in browser.page_source and digest["call sha256"] in browser.page_source
    assert "four eyes" in browser.page_source and "deploy_*" in browser.page_source
    browser.find_element(By.ID, "comment").send_keys("release notes checked")
    browser.save_screenshot(str(POLICY_SCREENSHOT))
    browser.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_for(lambda: "Approved by bob" in browser.page_source, 30, 0.1, "the decision shown")
    done = alice.wait(approved_id, timeout=120)
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "docs of site deployed to prod"

    browser.get(deployment.base + approval_path(alice.get(denied_id)))
    browser.find_element(By.ID, "comment").send_keys("freeze week")
    browser.find_element(By.CSS_SELECTOR, "button.deny").click()
    wait_for(lambda: "Denied by bob" in browser.page_source, 30, 0.1, "the denial shown")
    denied = alice.get(denied_id)
    assert denied["status"] == "completed" and denied["result"]["isError"] is True, denied
    assert denied["result"]["content"][0]["text"].startswith("not run: denied by bob: freeze week")
    alice.close()
