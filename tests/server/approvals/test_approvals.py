"""Approvals (`JobContext.approve`): the URL-mode request, the link for every client, the page's rules
through plain HTTP, what the page shows and to whom, withdrawal, timeouts, two deciders at once, the
webhook (also down or slow), and fifty approvals parked on a worker of one process.

Real Redis (a private one for Celery; the session's store in a store pass), a real prefork worker and
a real `mcp-celery serve --http`; the page is driven as a browser without JavaScript drives it
(`tests/server/approvals/test_approval_browser.py` uses Chromium, `tests/server/approvals/test_approval_security.py`
the security review).
"""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.logs import principal_digest
from mcp_celery.protocol import TASK_HANDLE_META
from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.processes import free_port, wait_for
from tests.support import approval_jobs
from tests.support.approval_support import (  # noqa: F401 - the fixtures
    URL_ELICITATION,
    Deployment,
    EventWatcher,
    alice_fixture,
    approval_worker_fixture,
    bob_page_fixture,
    deployment_fixture,
    signed_in,
    waiting,
)
from tests.support.harness import HttpClient, Process


def ended(client: HttpClient, task_id: str) -> dict[str, Any]:
    return client.wait(task_id, timeout=60)


def test_a_client_with_url_elicitation_gets_the_url_request_and_its_answer_decides_nothing(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 1, "approvers": ["bob"]}, **URL_ELICITATION)
    task = waiting(alice, task_id)
    ((key, request),) = task["inputRequests"].items()
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "url", request
    url = request["params"]["url"]
    assert url.startswith(f"{deployment.base}/approvals/") and len(url.rsplit("/", 1)[1]) >= 32, url
    assert request["params"]["message"] == "Hold #1?"
    assert url in task["statusMessage"], task
    # The client's own answer (its user went to the page) decides nothing: the task still waits.
    alice.result("tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "accept"}}})
    assert alice.get(task_id)["status"] == "input_required"
    decided = bob_page.decide(approval_path(task), "approve", "looks right")
    assert decided.status_code == 303, decided.text
    done = ended(alice, task_id)
    assert done["status"] == "completed", done
    assert done["result"]["content"][0]["text"] == "approved by bob: looks right", done


def test_the_decision_is_a_celery_event_for_flower_with_the_deciders_hashed_name(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    with EventWatcher(deployment.env["APPROVAL_BROKER_URL"]) as events:
        task_id = alice.start("hold", {"n": 10, "approvers": ["bob"]}, **URL_ELICITATION)
        assert bob_page.decide(approval_path(waiting(alice, task_id)), "approve", "fine").status_code == 303
        assert ended(alice, task_id)["status"] == "completed"
        (event,) = wait_for(lambda: events.of("task-approval") or None, 30, 0.05, "the task-approval event")
    assert event["uuid"] == task_id and event["approved"] is True, event
    assert event["by"] == principal_digest("bob") and event["result"] == f"approved by {principal_digest('bob')}"
    assert "bob" not in json.dumps(event), event  # the decider's name stays out of the event stream


def test_a_client_without_url_elicitation_sees_the_link_in_the_status_message(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 2}, elicitation={})  # form mode only
    task = waiting(alice, task_id)
    assert "waiting for approval: Hold #2?" in task["statusMessage"], task
    assert f"{deployment.base}/approvals/" in task["statusMessage"], task
    assert bob_page.decide(approval_path(task), "deny", "not today").status_code == 303
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "denied by bob: not today"


def test_a_plain_host_sees_the_link_in_task_status(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    called = alice.result("tools/call", {"name": "hold", "arguments": {"n": 3}}, capabilities={})
    task_id = called["_meta"][TASK_HANDLE_META]["taskId"]
    shown = alice.result("tools/call", {"name": "task_status", "arguments": {"task_id": task_id}}, capabilities={})
    text = shown["content"][0]["text"]
    assert f"{deployment.base}/approvals/" in text, text
    assert shown["structuredContent"]["status"] == "input_required"
    path = approval_path(shown["structuredContent"])
    assert bob_page.decide(path, "approve").status_code == 303
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob"


@pytest.mark.store
def test_the_pages_rules_hold_over_plain_http(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 4, "approvers": ["alice", "bob"], "four_eyes": True}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    anonymous = PageClient(deployment.base)
    assert "Sign in" in anonymous.get(path).text  # the id alone shows nothing
    carol, own = PageClient(deployment.base), PageClient(deployment.base)
    carol.sign_in(deployment.tokens["carol"])
    own.sign_in(deployment.tokens["alice"])
    assert (refused := carol.get(path)).status_code == 403 and "not one of the approvers" in refused.text
    assert (refused := own.get(path)).status_code == 403 and "four eyes" in refused.text
    assert own.post(path, {"decision": "approve", "csrf": "forged"}).status_code == 403
    page = bob_page.get(path)
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    token = csrf_of(page.text, path)
    # bob may decide, but only with this form's token of his own session: none, a made-up one, another
    # form's (sign-out), one of another session of his, and one of the right shape but one letter off.
    other_session = signed_in(deployment, deployment.tokens["bob"])
    forged = [
        None,
        "forged",
        csrf_of(page.text, "/approvals/sign-out"),
        csrf_of(other_session.get(path).text, path),
        token[:-1] + ("A" if token[-1] != "A" else "B"),
    ]
    for fake in forged:
        form = {"decision": "approve"} if fake is None else {"decision": "approve", "csrf": fake}
        replay = bob_page.post(path, form)
        assert replay.status_code == 403 and "CSRF" in replay.text, fake
    other_session.close()
    assert alice.get(task_id)["status"] == "input_required"
    assert bob_page.post(path, {"csrf": token, "decision": "approve", "comment": "first"}).status_code == 303
    assert "Approved by bob" in (shown := bob_page.get(path).text) and "<textarea" not in shown  # no second form
    again = bob_page.post(path, {"csrf": token, "decision": "deny", "comment": "second"})  # the same form again
    assert again.status_code == 409 and "already decided" in again.text and "Approved by bob" in again.text
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob: first"
    for client in (anonymous, carol, own):
        client.close()


@pytest.mark.store
def test_cancel_withdraws_the_approval_the_task_is_cancelled_and_a_later_decision_gets_409(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 5}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    token = csrf_of(bob_page.get(path).text, path)  # bob's page is open when alice cancels
    alice.result("tasks/cancel", {"taskId": task_id})
    assert alice.wait(task_id, timeout=60)["status"] == "cancelled"
    shown = bob_page.get(path).text
    assert "Withdrawn" in shown and "<textarea" not in shown
    late = bob_page.post(path, {"csrf": token, "decision": "approve", "comment": "too late"})
    assert late.status_code == 409 and "withdrawn" in late.text and "Withdrawn" in late.text, late.text
    assert alice.get(task_id)["status"] == "cancelled"
    assert path.rsplit("/", 1)[1] not in bob_page.get("/approvals").text


def test_the_webhook_gets_one_post_per_approval(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    before = len(deployment.webhook.bodies)
    ids = [alice.start("hold", {"n": 100 + i}, **URL_ELICITATION) for i in range(3)]
    paths = [approval_path(waiting(alice, task_id)) for task_id in ids]
    for path in paths:
        bob_page.decide(path, "approve")
    for task_id in ids:
        assert ended(alice, task_id)["status"] == "completed"  # each ran again after its decision
    posts = deployment.webhook.bodies[before:]
    assert len(posts) == 3, posts
    assert sorted(p["message"] for p in posts) == ["Hold #100?", "Hold #101?", "Hold #102?"]
    assert {p["tool"] for p in posts} == {"hold"} and {p["requester"] for p in posts} == {"alice"}
    assert sorted(p["link"].removeprefix(deployment.base) for p in posts) == sorted(paths)
    assert all(p["link"] in p["text"] for p in posts)


def test_fifty_pending_approvals_hold_no_worker_and_a_job_without_one_completes(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient, tmp_path: Path
) -> None:
    """The `*_alone` tools' queue has one worker, of one process; the module's worker serves another queue."""
    single = deployment.worker(tmp_path / "worker.log", concurrency=1, queues=approval_jobs.ALONE)
    try:
        ids = [alice.start("hold_alone", {"n": 1000 + i}, **URL_ELICITATION) for i in range(50)]
        tasks = {task_id: waiting(alice, task_id) for task_id in ids}
        quick = alice.start("quick_alone", {"x": 21})
        done = ended(alice, quick)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "42", done
        assert all(alice.get(task_id)["status"] == "input_required" for task_id in ids)
        listed = bob_page.get("/approvals").text
        assert all(approval_path(task) in listed for task in tasks.values()), listed[:500]
        for task_id, task in tasks.items():
            assert bob_page.decide(approval_path(task), "approve").status_code == 303, task_id
        for task_id in ids:
            assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob"
        assert single.output().count("Task tests.support.approval_jobs.hold_alone[") >= 100  # asked, then resumed: here
        assert "_alone[" not in approval_worker.output()  # and never on the module's worker of two processes
    finally:
        single.stop()


# ---------------------------------------------------------------- what the page shows, and to whom


def test_a_submitted_token_is_never_echoed_nor_logged(deployment: Deployment) -> None:
    page = PageClient(deployment.base, {"X-Forwarded-For": "198.51.100.77"})
    wrong = deployment.tokens["bob"][:-4] + "oops"  # a token-shaped mistake
    refused = page.sign_in(wrong)
    assert refused.status_code == 401 and "not accepted" in refused.text, refused.text
    accepted = page.sign_in(deployment.tokens["bob"])
    assert accepted.status_code == 303
    listed = page.get("/approvals")
    assert "Waiting for your decision" in listed.text
    for answer in (refused, accepted, listed):
        shown = answer.text + json.dumps(dict(answer.headers))
        assert wrong not in shown and deployment.tokens["bob"] not in shown
    assert deployment.server is not None
    assert wrong not in deployment.server.output() and deployment.tokens["bob"] not in deployment.server.output()
    page.close()


def test_nested_secret_looking_arguments_are_hidden_on_the_page_and_in_the_request(
    approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    extra = {
        "config": {"db_password": "hunter2-nested", "host": "db.internal"},
        "steps": [{"name": "migrate", "apiKey": "k-deep-123"}],
        "source": "redis://:pw-in-url@cache:6379/0",
    }
    task_id = alice.start("hold", {"n": 11, "approvers": ["bob"], "extra": extra}, **URL_ELICITATION)
    task = waiting(alice, task_id)
    page = bob_page.get(approval_path(task)).text
    for secret in ("hunter2-nested", "k-deep-123", "pw-in-url"):
        assert secret not in page and secret not in json.dumps(task), secret
    assert "db.internal" in page and "migrate" in page and "***" in page
    assert bob_page.decide(approval_path(task), "deny").status_code == 303
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "denied by bob"


def test_the_jobs_message_and_details_are_escaped_on_the_page_and_in_the_list(
    approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    message = '<script>alert("m")</script> & <b>bold</b>'
    details = {"note": '<img src=x onerror="alert(1)">', "<key>": "v"}
    arguments = {"n": 12, "approvers": ["bob"], "message": message, "details": details}
    task = waiting(alice, task_id := alice.start("hold", arguments, **URL_ELICITATION))
    path = approval_path(task)
    for shown in (bob_page.get(path).text, bob_page.get("/approvals").text):
        assert "<script" not in shown and "<b>" not in shown and "<img" not in shown and "<key>" not in shown
        assert "&lt;script&gt;alert(&quot;m&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in shown
    page = bob_page.get(path).text
    assert "&lt;img src=x onerror=" in page and "&lt;key&gt;" in page
    assert bob_page.decide(path, "approve").status_code == 303
    assert ended(alice, task_id)["status"] == "completed"


@pytest.mark.store
def test_each_persons_list_leaves_out_what_they_may_not_decide(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    for_bob = waiting(alice, bob_only := alice.start("hold", {"n": 13, "approvers": ["bob"]}, **URL_ELICITATION))
    for_anyone = waiting(alice, anyone := alice.start("hold", {"n": 14}, **URL_ELICITATION))  # but alice
    ids = {name: approval_path(task).rsplit("/", 1)[1] for name, task in (("bob", for_bob), ("any", for_anyone))}
    carol, own = signed_in(deployment, deployment.tokens["carol"]), signed_in(deployment, deployment.tokens["alice"])
    listed = {"bob": bob_page.get("/approvals").text, "carol": carol.get("/approvals").text}
    listed["alice"] = own.get("/approvals").text
    assert ids["bob"] in listed["bob"] and ids["any"] in listed["bob"]
    assert ids["bob"] not in listed["carol"] and ids["any"] in listed["carol"]
    assert ids["bob"] not in listed["alice"] and ids["any"] not in listed["alice"]  # she asked both
    for task_id, task in ((bob_only, for_bob), (anyone, for_anyone)):
        assert bob_page.decide(approval_path(task), "approve").status_code == 303
        assert ended(alice, task_id)["status"] == "completed"
    carol.close()
    own.close()


# ---------------------------------------------------------------- timing: too late, at the same moment


@pytest.mark.parametrize("job", ["waiting", pytest.param("parked", marks=pytest.mark.store)])
def test_an_approval_that_times_out_ends_the_task_closes_the_page_and_refuses_a_late_decision(
    approval_worker: Process, alice: HttpClient, bob_page: PageClient, job: str
) -> None:
    """A waiting job gets InputTimeout (its tool error here); a parked one is ended by the server, failed."""
    tool = "hold_awake" if job == "waiting" else "hold"
    task_id = alice.start(tool, {"n": 15, "timeout": 2}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    token = csrf_of(bob_page.get(path).text, path)  # bob opened it in time, and decides too late
    done = ended(alice, task_id)
    if job == "waiting":
        assert done["status"] == "completed" and done["result"]["isError"], done
        assert "InputTimeout" in done["result"]["content"][0]["text"], done
    else:
        assert done["status"] == "failed" and "within its input timeout" in done["statusMessage"], done
    shown = bob_page.get(path).text
    assert "Closed" in shown and "<textarea" not in shown
    late = bob_page.post(path, {"csrf": token, "decision": "approve"})
    assert late.status_code == 409 and "nothing changed" in late.text
    assert path.rsplit("/", 1)[1] not in bob_page.get("/approvals").text


@pytest.mark.store
def test_two_approvers_deciding_at_the_same_moment_make_one_decision(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    carol = signed_in(deployment, deployment.tokens["carol"])
    choices = {"bob": (bob_page, "approve"), "carol": (carol, "deny")}
    for round_ in range(4):
        task_id = alice.start("hold", {"n": 20 + round_, "approvers": ["bob", "carol"]}, **URL_ELICITATION)
        path = approval_path(waiting(alice, task_id))
        tokens = {name: csrf_of(page.get(path).text, path) for name, (page, _) in choices.items()}
        together = threading.Barrier(2)

        def post(name: str, path: str = path, tokens: dict[str, str] = tokens, together: Any = together) -> int:
            page, decision = choices[name]
            together.wait()
            return page.post(path, {"csrf": tokens[name], "decision": decision}).status_code

        with ThreadPoolExecutor(2) as pool:
            statuses = dict(zip(choices, pool.map(post, choices), strict=True))
        assert sorted(statuses.values()) == [303, 409], statuses
        (winner,) = [name for name, status in statuses.items() if status == 303]
        verdict = "approved" if winner == "bob" else "denied"
        assert ended(alice, task_id)["result"]["content"][0]["text"] == f"{verdict} by {winner}"
        assert f"{verdict.capitalize()} by {winner}" in carol.get(path).text  # what both now see
    carol.close()


# ---------------------------------------------------------------- a worker's settings: webhook, public URL


@pytest.mark.parametrize("webhook", ["down", "slow"])
def test_a_webhook_that_is_down_or_slow_still_lets_the_job_ask_and_be_decided(
    deployment: Deployment, alice: HttpClient, bob_page: PageClient, tmp_path: Path, webhook: str
) -> None:
    """Down: nothing listens on its port. Slow: a socket that takes the connection and never answers
    (the worker gives up after WEBHOOK_TIMEOUT_S, 10 s)."""
    silent = socket.create_server(("127.0.0.1", 0))  # listens; never accepts, never answers
    port = free_port() if webhook == "down" else silent.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hook"
    single = deployment.worker(tmp_path / "worker.log", queues=approval_jobs.ALONE, MCP_CELERY_APPROVAL_WEBHOOK=url)
    try:
        task_id = alice.start("hold_alone", {"n": 30}, **URL_ELICITATION)
        task = alice.wait(task_id, {"input_required"}, timeout=60)
        assert "could not POST the approval to MCP_CELERY_APPROVAL_WEBHOOK" in single.output()
        assert url not in single.output()  # the URL may hold a secret
        assert bob_page.decide(approval_path(task), "approve").status_code == 303
        assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob"
    finally:
        single.stop()
        silent.close()


def test_without_a_public_url_on_the_worker_the_job_is_told_what_to_set(
    deployment: Deployment, alice: HttpClient, tmp_path: Path
) -> None:
    single = deployment.worker(tmp_path / "worker.log", queues=approval_jobs.ALONE, MCP_CELERY_PUBLIC_URL=None)
    try:
        done = ended(alice, alice.start("hold_alone", {"n": 31}, **URL_ELICITATION))
        assert done["status"] == "completed" and done["result"]["isError"], done
        assert "set MCP_CELERY_PUBLIC_URL on the worker" in done["result"]["content"][0]["text"], done
    finally:
        single.stop()
