"""Approvals (`JobContext.approve`): the URL-mode request, the link for every client, the page's rules
through plain HTTP, the webhook, and fifty approvals parked on a worker of one process.

Real Redis (a private one), a real prefork worker and a real `mcp-celery serve --http`; the page is
driven as a browser without JavaScript drives it (`tests/test_approval_browser.py` uses Chromium).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from mcp_celery.logs import principal_digest
from mcp_celery.protocol import TASK_HANDLE_META
from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.processes import wait_for
from tests.approval_support import Deployment, deployment_fixture  # noqa: F401 - the fixture
from tests.support import HttpClient, Process

URL_ELICITATION = {"elicitation": {"url": {}}}


@pytest.fixture(scope="module")
def worker(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = deployment.worker(tmp_path_factory.mktemp("approval-worker") / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture
def alice(deployment: Deployment) -> Iterator[HttpClient]:
    client = deployment.client("alice")
    yield client
    client.close()


@pytest.fixture
def bob_page(deployment: Deployment) -> Iterator[PageClient]:
    page = PageClient(deployment.base)
    assert page.sign_in(deployment.tokens["bob"]).status_code == 303
    yield page
    page.close()


def waiting(client: HttpClient, task_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: t if (t := client.get(task_id))["status"] == "input_required" else None, 60, 0.05, f"{task_id} asks"
    )


def ended(client: HttpClient, task_id: str) -> dict[str, Any]:
    return client.wait(task_id, timeout=60)


def test_a_client_with_url_elicitation_gets_the_url_request_and_its_answer_decides_nothing(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
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


class EventWatcher:
    """Celery events of the approval app, received as Flower receives them (a receiver on the broker)."""

    def __init__(self, broker_url: str) -> None:
        self.app = Celery("approval-events", broker=broker_url)
        self.seen: list[dict[str, Any]] = []
        self._connection = self.app.connection_for_read()
        self._receiver = self.app.events.Receiver(self._connection, handlers={"*": self.seen.append})
        self._thread = threading.Thread(target=self._receiver.capture, kwargs={"wakeup": False}, daemon=True)

    def __enter__(self) -> EventWatcher:
        self._thread.start()
        # Events sent before the receiver's queue is bound are lost: send probes until one comes back.
        probe = f"probe-{uuid.uuid4()}"

        def probed() -> bool:
            with self.app.events.default_dispatcher() as dispatcher:
                dispatcher.send("test-probe", probe=probe)
            return any(e.get("probe") == probe for e in self.seen)

        wait_for(probed, 30, 0.2, "the event receiver to receive its own probe")
        return self

    def __exit__(self, *exc: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=10)
        self._connection.release()

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["type"] == event_type]


def test_the_decision_is_a_celery_event_for_flower_with_the_deciders_hashed_name(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
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
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 2}, elicitation={})  # form mode only
    task = waiting(alice, task_id)
    assert "waiting for approval: Hold #2?" in task["statusMessage"], task
    assert f"{deployment.base}/approvals/" in task["statusMessage"], task
    assert bob_page.decide(approval_path(task), "deny", "not today").status_code == 303
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "denied by bob: not today"


def test_a_plain_host_sees_the_link_in_task_status(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
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


def test_the_pages_rules_hold_over_plain_http(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
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
    replay = bob_page.post(path, {"decision": "approve"})  # a form post without its CSRF token
    assert replay.status_code == 403 and "CSRF" in replay.text
    assert alice.get(task_id)["status"] == "input_required"
    page = bob_page.get(path)
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert deployment.tokens["bob"] not in page.text
    token = csrf_of(page.text, path)
    assert bob_page.post(path, {"csrf": token, "decision": "approve", "comment": "first"}).status_code == 303
    assert "Approved by bob" in (shown := bob_page.get(path).text) and "<textarea" not in shown  # no second form
    again = bob_page.post(path, {"csrf": token, "decision": "deny", "comment": "second"})  # the same form again
    assert again.status_code == 409 and "already decided" in again.text and "Approved by bob" in again.text
    assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob: first"
    for client in (anonymous, carol, own):
        client.close()


def test_cancel_withdraws_the_approval_and_the_page_says_so(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 5}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    alice.result("tasks/cancel", {"taskId": task_id})
    assert "Withdrawn" in bob_page.get(path).text
    assert path.rsplit("/", 1)[1] not in bob_page.get("/approvals").text


def test_the_webhook_gets_one_post_per_approval(
    deployment: Deployment, worker: Process, alice: HttpClient, bob_page: PageClient
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
    deployment: Deployment, alice: HttpClient, bob_page: PageClient, tmp_path: Path
) -> None:
    single = deployment.worker(tmp_path / "worker.log", concurrency=1)
    try:
        ids = [alice.start("hold", {"n": 1000 + i, "approvers": ["bob"]}, **URL_ELICITATION) for i in range(50)]
        tasks = {task_id: waiting(alice, task_id) for task_id in ids}
        quick = alice.start("quick", {"x": 21})
        done = ended(alice, quick)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "42", done
        assert all(alice.get(task_id)["status"] == "input_required" for task_id in ids)
        listed = bob_page.get("/approvals").text
        assert "Waiting for your decision (50)" in listed, listed[:500]
        for task_id, task in tasks.items():
            assert bob_page.decide(approval_path(task), "approve").status_code == 303, task_id
        for task_id in ids:
            assert ended(alice, task_id)["result"]["content"][0]["text"] == "approved by bob"
    finally:
        single.stop()


def test_sign_in_is_rate_limited(deployment: Deployment) -> None:
    """Last in the module: it spends the loopback address's failed sign-ins for the minute."""
    page = PageClient(deployment.base)
    statuses = [page.sign_in("not-a-token").status_code for _ in range(12)]
    assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429], statuses
    page.close()
