"""The approval policy (MCP_CELERY_APPROVAL_POLICY): an operator holds calls of tools for a named person's
approval without changing them; nothing is queued until the page's decision, and then exactly once.

The policy file's parser on its own first; then real Redis (a private one), real prefork workers and
real `mcp-celery serve --http` processes (the deployment's, and a replica on the same Redis whose
reaper looks every second), with `approval_support.POLICY` over `approval_jobs`' tools. The plain
Celery task `deploy_service` goes to a queue of its own that no worker takes until a test starts
one, so what reaches the broker is counted on the queue itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery import idempotency
from mcp_celery.core.calls import call_digest
from mcp_celery.errors import ConfigurationError
from mcp_celery.logs import principal_digest
from mcp_celery.protocol import TASK_HANDLE_META
from mcp_celery.server.engine.policy import parse_policy
from mcp_celery.store.schema import Keys
from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.processes import free_port, wait_for
from tests.support import approval_jobs
from tests.support.approval_support import (  # noqa: F401 - the fixtures
    APP,
    POLICY,
    Deployment,
    EventWatcher,
    alice_fixture,
    approval_worker_fixture,
    deployment_fixture,
)
from tests.support.harness import ROOT, HttpClient, Process, caps

URL_ELICITATION = {"elicitation": {"url": {}}}
TOOLS = {"deploy_service": ["service", "env", "api_token"], "restart_service": ["service"]}


# ---------------------------------------------------------------- the file


def test_a_policy_names_approvers_per_tool_or_glob_and_an_exact_name_wins() -> None:
    policy = parse_policy(
        '[tools."deploy_*"]\napprovers = ["bob", "carol"]\ntimeout_s = 60\n\n'
        '[tools.deploy_docs]\napprovers = ["dora"]\nfour_eyes = false\nmessage = "Docs {env}?"\n',
        "policy.toml",
        {"deploy_docs": ["service", "env"]},
    )
    glob, exact = policy.rule_for("deploy_web"), policy.rule_for("deploy_docs")
    assert glob is not None and glob.approvers == ("bob", "carol") and glob.four_eyes and glob.timeout_s == 60
    assert exact is not None and exact.approvers == ("dora",) and not exact.four_eyes and exact.timeout_s is None
    assert policy.rule_for("Deploy_web") is None and policy.rule_for("restart") is None
    assert exact.message_for("deploy_docs", {"env": "prod"}) == "Docs prod?"
    assert glob.message_for("deploy_web", {}) == "Run deploy_web?"


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        ('[tools.restart_service]\napprovers = "bob"\n', 2, "approvers must be a non-empty list"),
        ('# ops\n[tools.restart_service]\napprover = ["bob"]\n', 3, "did you mean 'approvers'?"),
        ('[tools."deploy_*"]\nfour_eyes = true\n', 1, "approvers is required"),
        ('[tools."deploy_*"]\napprovers = ["bob"]\n\nmessage = "Deploy {servce}?"\n', 4, "not an argument of tool"),
        ('[tools.x]\napprovers = ["bob"]\nmessage = "{env.__class__}"\n', 3, "argument's plain name"),
        ('[tools.x]\napprovers = ["bob"]\ntimeout_s = 0\n', 3, "above 0"),
        ('[tools.x]\napprovers = ["b o b"]\n', 2, "principal names"),
        ('[tools.x\napprovers = ["bob"]\n', 1, "Expected ']'"),
        ('[tool.x]\napprovers = ["bob"]\n', 1, "unknown top-level key 'tool'"),
        ('[tools]\nx = { approvers = ["bob"], four_eyes = "no" }\n', 2, "four_eyes must be true or false"),
    ],
)
def test_a_mistake_in_the_policy_is_refused_with_its_line(text: str, line: int, said: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_policy(text, "policy.toml", TOOLS | {"x": ["env"]})
    quoted = text.splitlines()[line - 1].strip()
    assert f"approval policy policy.toml line {line} ({quoted}): " in str(refused.value), refused.value
    assert said in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("policy", "http", "said"),
    [
        (
            '[tools."deploy_*"]\napprovers = ["bob"]\nfour_eyes = "yes"\n',
            True,
            'line 3 (four_eyes = "yes"): four_eyes must be true or false',
        ),
        ('[tools.restart_service]\napprovers = ["bob"]\n', False, "needs MCP_CELERY_PUBLIC_URL over stdio"),
    ],
)
def test_serve_refuses_to_start_with_a_policy_it_cannot_apply(
    deployment: Deployment, tmp_path: Path, policy: str, http: bool, said: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", APP]
    args += ["--http", "--port", str(free_port())] if http else []
    env = {k: v for k, v in deployment.env.items() if k != "MCP_CELERY_PUBLIC_URL"}
    env["MCP_CELERY_APPROVAL_POLICY"] = str(path)
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("mcp-celery: "), done.stderr  # one line


# ---------------------------------------------------------------- the deployment


@pytest.fixture(scope="module")
def gated_worker(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A worker of the held tool's queue, for the tests after those that count what reaches that queue."""
    log = tmp_path_factory.mktemp("policy-gated-worker") / "worker.log"
    proc = deployment.worker(log, queues=approval_jobs.GATED_QUEUE)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def replica(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second server on the same Redis, whose reaper looks every second and for messages after one."""
    port = free_port()
    log = tmp_path_factory.mktemp("policy-replica") / "server.log"
    server = deployment.serve(port, log, MCP_CELERY_QUEUE_CHECK_S="1", MCP_CELERY_WORKER_LOST_TIMEOUT_S="3")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def signed_in(base: str, token: str) -> PageClient:
    page = PageClient(base)
    assert page.sign_in(token).status_code == 303
    return page


def broker(deployment: Deployment) -> redis.Redis:
    return redis.Redis.from_url(deployment.env["APPROVAL_BROKER_URL"])


def runs(deployment: Deployment, service: str, env: str) -> int:
    backend = redis.Redis.from_url(deployment.env["APPROVAL_BACKEND_URL"])
    return int(backend.get(approval_jobs.runs_key(service, env)) or 0)


def waiting(client: HttpClient, task_id: str) -> dict[str, Any]:
    return client.wait(task_id, ["input_required"], timeout=30)


def test_an_exposed_celery_task_waits_unqueued_and_twenty_racing_approvals_queue_it_once(
    deployment: Deployment, replica: str, alice: HttpClient, tmp_path: Path
) -> None:
    arguments = {"service": "web", "env": "prod", "api_token": "s3cr3t-value"}
    began = time.monotonic()
    call = {"name": "deploy_service", "arguments": arguments}
    created = alice.result("tools/call", call, capabilities=caps(**URL_ELICITATION))
    task_id = created["taskId"]
    task = alice.get(task_id)
    took_ms = (time.monotonic() - began) * 1000
    assert task["status"] == "input_required" and took_ms < 1000, (took_ms, task)
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 0  # nothing sent to Celery
    (request,) = task["inputRequests"].values()
    approval = request["params"]["_meta"]["mcp-celery/approval"]
    assert request["params"]["mode"] == "url" and request["params"]["message"] == "Deploy web to prod?"
    assert request["params"]["url"].startswith(f"{deployment.base}/approvals/"), request
    assert approval["approvers"] == ["bob", "carol"] and approval["fourEyes"] and approval["requester"] == "alice"
    assert approval["arguments"]["api_token"] == "***" and "s3cr3t" not in json.dumps(task)
    assert approval["details"] == {
        "approval policy": "deploy_*",
        "call sha256": call_digest("deploy_service", arguments),
    }
    unheld = alice.result("tools/call", {"name": "quick", "arguments": {"x": 1}}, capabilities=caps())
    assert created["ttlMs"] - unheld["ttlMs"] == 3600 * 1000  # the approval's window (the input timeout) on top

    path = approval_path(task)
    pages = [signed_in(deployment.base, deployment.tokens["bob"]) for _ in range(10)]
    pages += [signed_in(replica, deployment.tokens["carol"]) for _ in range(10)]
    forms = [{"csrf": csrf_of(page.get(path).text, path), "decision": "approve"} for page in pages]
    start = threading.Barrier(len(pages))
    statuses: list[int] = []

    def approve(page: PageClient, form: dict[str, str]) -> None:
        start.wait(30)
        statuses.append(page.post(path, form).status_code)

    threads = [threading.Thread(target=approve, args=pair) for pair in zip(pages, forms, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(statuses) == [303] + [409] * 19, statuses
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 1  # one message, whoever approved where
    for page in pages:
        page.close()

    gated = deployment.worker(tmp_path / "gated.log", queues=approval_jobs.GATED_QUEUE)
    try:
        done = alice.wait(task_id, timeout=60)
    finally:
        gated.stop()
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "deployed web to prod", done
    assert runs(deployment, "web", "prod") == 1


def test_a_denied_call_completes_not_run_denied_by_name_and_is_never_queued(
    deployment: Deployment, alice: HttpClient
) -> None:
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    with EventWatcher(deployment.env["APPROVAL_BROKER_URL"]) as events:
        task_id = alice.start("deploy_service", {"service": "db", "env": "prod"})
        assert bob.decide(approval_path(waiting(alice, task_id)), "deny", "not on a Friday").status_code == 303
        done = alice.get(task_id)  # decided within the page's request: no wait
        assert done["status"] == "completed", done
        (event,) = wait_for(lambda: events.of("task-approval") or None, 30, 0.05, "the task-approval event")
        (revoked,) = wait_for(lambda: events.of("task-revoked") or None, 30, 0.05, "the task-revoked event")
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    text = done["result"]["content"][0]["text"]
    assert text.startswith("not run: denied by bob: not on a Friday\n") and "deploy_service did not run" in text
    assert done["statusMessage"] == "not run: denied by bob: not on a Friday"
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 0 and runs(deployment, "db", "prod") == 0
    assert event["uuid"] == task_id and event["approved"] is False and event["by"] == principal_digest("bob")
    assert revoked["uuid"] == task_id and "bob" not in json.dumps([event, revoked])  # names stay out of events
    bob.close()


def test_a_held_call_sent_again_with_its_idempotency_key_gets_the_same_held_task(
    deployment: Deployment, alice: HttpClient
) -> None:
    """A lost reply's retry (issue 47) finds the call the policy holds: one task, one approval asked."""
    call = {"name": "deploy_service", "arguments": {"service": "cache", "env": "prod"}}
    key = {idempotency.HEADER: str(uuid.uuid4())}
    first = alice.result("tools/call", call, capabilities=caps(**URL_ELICITATION), headers=key)
    assert alice.result("tools/call", call, capabilities=caps(**URL_ELICITATION), headers=key) == first
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    assert bob.decide(approval_path(waiting(alice, first["taskId"])), "deny", "not twice").status_code == 303
    bob.close()
    assert alice.get(first["taskId"])["statusMessage"] == "not run: denied by bob: not twice"
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 0 and runs(deployment, "cache", "prod") == 0


def test_an_approval_runs_only_the_call_it_was_asked_for(deployment: Deployment, alice: HttpClient) -> None:
    """The kept message is checked against the request the approver saw: changed, it does not run."""
    task_id = alice.start("deploy_service", {"service": "billing", "env": "staging"})
    path = approval_path(waiting(alice, task_id))
    store = redis.Redis.from_url(deployment.env["APPROVAL_BACKEND_URL"])
    kept = json.loads(store.hget(Keys().task(task_id), "resume") or b"{}")
    kept["kwargs"]["env"] = "prod"  # what a bug (or someone with the store's keys) could make of it
    store.hset(Keys().task(task_id), "resume", json.dumps(kept))
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    assert bob.decide(path, "approve", "staging is fine").status_code == 303
    done = alice.get(task_id)
    assert done["statusMessage"] == "not run: approved by bob, but not for these arguments", done
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 0 and runs(deployment, "billing", "prod") == 0
    bob.close()


def test_an_approval_the_policy_no_longer_allows_does_not_run(deployment: Deployment, alice: HttpClient) -> None:
    task_id = alice.start("deploy_service", {"service": "search", "env": "prod"})
    path = approval_path(waiting(alice, task_id))
    policy = Path(deployment.env["MCP_CELERY_APPROVAL_POLICY"])
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    try:
        policy.write_text(POLICY.replace('approvers = ["bob", "carol"]', 'approvers = ["carol"]'))
        assert bob.decide(path, "approve").status_code == 303  # the request as asked still names bob
    finally:
        policy.write_text(POLICY)
    done = alice.get(task_id)
    assert done["statusMessage"].startswith("not run: approved by bob, but the policy as it reads now does not let")
    assert broker(deployment).llen(approval_jobs.GATED_QUEUE) == 0 and runs(deployment, "search", "prod") == 0
    bob.close()


def test_a_call_held_across_a_server_restart_runs_once_approved(
    deployment: Deployment, gated_worker: Process, alice: HttpClient
) -> None:
    task_id = alice.start("deploy_service", {"service": "api", "env": "staging"})
    path = approval_path(waiting(alice, task_id))
    deployment.restart_server()
    carol = signed_in(deployment.base, deployment.tokens["carol"])
    assert alice.get(task_id)["status"] == "input_required"
    assert carol.decide(path, "approve", "after the restart").status_code == 303
    done = alice.wait(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "deployed api to staging", done
    assert "Approved by carol" in carol.get(path).text and runs(deployment, "api", "staging") == 1
    carol.close()


def test_a_call_nobody_approves_in_time_completes_not_run(
    deployment: Deployment, replica: str, alice: HttpClient
) -> None:
    task_id = alice.start("restart_service", {"service": "cache"})
    path = approval_path(waiting(alice, task_id))
    done = alice.wait(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    assert done["statusMessage"] == "not run: no decision within 3 s (approvers: bob)", done
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    assert "Closed" in bob.get(path).text and path.rsplit("/", 1)[1] not in bob.get("/approvals").text
    bob.close()


def test_the_reaper_never_takes_a_held_call_for_a_lost_message(deployment: Deployment, replica: str) -> None:
    """The replica's reaper fails a task whose message is gone (the control) after a second or two; a held
    call, which has a record and no message either, created before it, still waits."""
    client = HttpClient(f"{replica}/mcp", deployment.tokens["alice"])
    held = client.start("deploy_service", {"service": "queue", "env": "test"})
    control = client.start("archive_logs", {"day": "2026-12-01"})
    assert broker(deployment).delete(approval_jobs.NOWHERE_QUEUE) == 1  # the control's message, lost
    lost = client.wait(control, timeout=60)
    assert lost["status"] == "failed" and "lost before any worker started it" in lost["statusMessage"], lost
    assert client.get(held)["status"] == "input_required"
    client.close()


def test_a_plain_host_gets_the_approval_link_at_once_not_after_its_inline_window(
    deployment: Deployment, approval_worker: Process, alice: HttpClient
) -> None:
    began = time.monotonic()
    called = alice.result(
        "tools/call", {"name": "deploy_docs", "arguments": {"service": "shop", "env": "prod"}}, capabilities={}
    )
    took_s = time.monotonic() - began
    text = called["content"][0]["text"]
    window_s = float(deployment.env.get("MCP_CELERY_INLINE_S", "20"))
    assert took_s < window_s / 2 and f"{deployment.base}/approvals/" in text and "Deploy shop to prod?" in text, (
        took_s,
        text,
    )
    assert "approval policy holds this call of deploy_docs" in text and "nothing has run yet" in text, text
    assert "one of bob, carol must open" in text and "Nothing to answer here" in text, text
    task_id = called["_meta"][TASK_HANDLE_META]["taskId"]
    shown = alice.result("tools/call", {"name": "task_status", "arguments": {"task_id": task_id}}, capabilities={})
    bob = signed_in(deployment.base, deployment.tokens["bob"])
    assert bob.decide(approval_path(shown["structuredContent"]), "approve").status_code == 303
    assert alice.wait(task_id, timeout=60)["result"]["content"][0]["text"] == "docs of shop deployed to prod"
    bob.close()


def test_the_policy_is_read_again_when_it_changes_and_refuses_every_call_while_broken(
    deployment: Deployment, approval_worker: Process, alice: HttpClient
) -> None:
    policy = Path(deployment.env["MCP_CELERY_APPROVAL_POLICY"])
    broken = POLICY + "\n[tools.archive_logs]\n"
    line = broken.splitlines().index("[tools.archive_logs]") + 1
    assert deployment.server is not None
    try:
        policy.write_text(POLICY + '\n[tools.archive_logs]\napprovers = ["carol"]\n')
        assert waiting(alice, alice.start("archive_logs", {"day": "2026-12-02"}))["status"] == "input_required"
        policy.write_text(broken)
        refused = alice.call("tools/call", {"name": "quick", "arguments": {"x": 1}})
        assert refused["error"]["message"] == (
            "the server's approval policy cannot be read; no tool runs until it is fixed"
        ), refused
        said = f"approval policy {policy} line {line} ([tools.archive_logs]): approvers is required"
        wait_for(lambda: said in deployment.server.output(), 10, 0.05, "the server's log line naming the line")
    finally:
        policy.write_text(POLICY)
    assert alice.wait(alice.start("quick", {"x": 2}), timeout=60)["result"]["content"][0]["text"] == "4"
