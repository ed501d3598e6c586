"""The approval page as a security team reviews it: who may decide by default, sessions that end with
their credential, and the HTTP edge in front of the page (body limits, the sign-in limit behind a
proxy, Host and Origin, malformed cookies and tokens, /metrics).

Real Redis, a real prefork worker and a real `mcp-celery serve --http` (`tests.support.approval_support`), whose
X-Forwarded-For from loopback is believed (MCP_CELERY_TRUSTED_PROXIES), so that each test that spends
failed sign-ins does it as a client of its own.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from mcp_celery.server.edge.tokens import new_token
from mcp_celery.testing.approvals import PageClient, approval_path, csrf_of
from mcp_celery.testing.processes import free_port, wait_for
from tests.support.approval_support import (  # noqa: F401 - the fixtures
    URL_ELICITATION,
    Deployment,
    alice_fixture,
    approval_worker_fixture,
    bob_page_fixture,
    deployment_fixture,
    signed_in,
    waiting,
)
from tests.support.harness import ROOT, HttpClient, Process

#: The server's default MCP_CELERY_APPROVAL_SIGN_IN_LIMIT.
LIMIT = 10


def decided(client: HttpClient, task_id: str) -> str:
    done = client.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    return str(done["result"]["content"][0]["text"])


def form_token(page: PageClient, path: str) -> str:
    return csrf_of(page.get(path).text, path)


# ---------------------------------------------------------------- who decides, by default


@pytest.mark.store
def test_the_requester_never_decides_unless_the_job_passes_four_eyes_false(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    own = signed_in(deployment, deployment.tokens["alice"])
    anyone = alice.start("hold", {"n": 1}, **URL_ELICITATION)  # approvers None: anyone but alice
    named = alice.start("hold", {"n": 2, "approvers": ["alice", "bob"]}, **URL_ELICITATION)
    for task_id in (anyone, named):
        path = approval_path(waiting(alice, task_id))
        refused = own.get(path)
        assert refused.status_code == 403 and "four eyes" in refused.text, refused.text
        assert path.rsplit("/", 1)[1] not in own.get("/approvals").text  # not in her list either
        assert bob_page.decide(path, "approve").status_code == 303
        assert decided(alice, task_id) == "approved by bob"
    explicit = alice.start("hold", {"n": 3, "approvers": ["alice"], "four_eyes": False}, **URL_ELICITATION)
    assert own.decide(approval_path(waiting(alice, explicit)), "approve").status_code == 303
    assert decided(alice, explicit) == "approved by alice"  # the job's own, explicit, choice
    own.close()


def test_approvers_given_as_a_string_are_refused_with_a_clear_error(
    approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 4, "approvers": "bob"}, **URL_ELICITATION)
    task = alice.wait(task_id, {"input_required", "completed", "failed"}, timeout=60)
    assert task["status"] == "completed", task  # not waiting for "b" or "o"
    done = alice.wait(task_id, timeout=60)
    text = done["result"]["content"][0]["text"]
    assert done["result"]["isError"] and "approvers must be a list of principal names" in text, done


# ---------------------------------------------------------------- sessions end with their credential


@pytest.mark.store
def test_signing_out_ends_the_session_on_the_server_not_only_in_the_browser(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    task_id = alice.start("hold", {"n": 5, "approvers": ["bob"]}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    copy = PageClient(deployment.base)
    copy.cookies.update(bob_page.cookies)  # what a stolen or cached cookie would be
    token = form_token(copy, path)
    sign_out = csrf_of(bob_page.get("/approvals").text, "/approvals/sign-out")
    assert bob_page.post("/approvals/sign-out", {"csrf": sign_out}).status_code == 303
    assert "mcp_celery_approvals" not in bob_page.cookies
    assert "Sign in to decide approvals" in copy.get("/approvals").text
    refused = copy.post(path, {"csrf": token, "decision": "approve"})
    assert refused.status_code == 401 and "Sign in" in refused.text
    assert alice.get(task_id)["status"] == "input_required"
    again = signed_in(deployment, deployment.tokens["bob"])
    assert again.decide(path, "deny", "after signing in again").status_code == 303
    assert decided(alice, task_id) == "denied by bob: after signing in again"
    copy.close()
    again.close()


@pytest.mark.store
def test_revoking_a_token_or_removing_its_line_ends_that_persons_open_sessions_at_once(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    tokens = {name: new_token(name, deployment.token_file) for name in ("dave", "erin")}
    task_id = alice.start("hold", {"n": 6, "approvers": ["dave", "erin", "bob"]}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    pages = {name: signed_in(deployment, token) for name, token in tokens.items()}
    forms = {name: form_token(page, path) for name, page in pages.items()}  # their pages are open

    def refused(name: str) -> None:
        answer = pages[name].post(path, {"csrf": forms[name], "decision": "approve", "comment": name})
        assert answer.status_code == 401 and "Sign in to decide" in answer.text, (name, answer.text)
        assert "Sign in to decide approvals" in pages[name].get("/approvals").text, name

    lines = deployment.token_file.read_text().splitlines()  # an operator edits the file: erin's line goes
    deployment.token_file.write_text("".join(f"{line}\n" for line in lines if not line.startswith("erin ")))
    refused("erin")
    revoke = [sys.executable, "-m", "mcp_celery", "token", "revoke", "dave", "--file", str(deployment.token_file)]
    done = subprocess.run(revoke, cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"revoked 1 token of dave in {deployment.token_file}"
    refused("dave")
    for page in pages.values():
        page.close()
    assert alice.get(task_id)["status"] == "input_required"  # nothing was decided
    dave = HttpClient(deployment.mcp_url, tokens["dave"])
    assert dave.post("tasks/get", {"taskId": task_id}).status_code == 401  # /mcp refuses the token too
    dave.close()
    assert bob_page.decide(path, "approve").status_code == 303  # bob's own session is untouched
    assert decided(alice, task_id) == "approved by bob"


def test_a_session_opened_with_a_jwt_ends_at_its_exp(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    credential = deployment.issuer.jwt("frank", lasts_s=8)
    expires = time.time() + 8
    task_id = alice.start("hold", {"n": 7, "approvers": ["frank", "bob"]}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    page = signed_in(deployment, credential)
    token = form_token(page, path)  # frank may decide, while his JWT lasts
    wait_for(lambda: time.time() > expires + 1, 20, 0.2, "the JWT's exp to pass")
    refused = page.post(path, {"csrf": token, "decision": "approve"})
    assert refused.status_code == 401 and "Sign in to decide" in refused.text, refused.text
    assert alice.get(task_id)["status"] == "input_required"
    assert bob_page.decide(path, "deny").status_code == 303
    assert decided(alice, task_id) == "denied by bob"
    page.close()


# ---------------------------------------------------------------- the edge


def raw_head(deployment: Deployment, request: bytes, timeout: float = 15) -> bytes:
    """Send `request` (headers and what of the body it holds) and read the answer's status line and headers."""
    port = int(deployment.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_a_ten_megabyte_form_gets_413_before_the_page_reads_it(deployment: Deployment) -> None:
    port = deployment.base.rsplit(":", 1)[1]
    for path in ("/approvals/sign-in", "/approvals/sign-out", "/approvals/" + "x" * 32):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {10 * 1024 * 1024}\r\n\r\n"
        ).encode()
        answer = raw_head(deployment, head + b"token=" + b"x" * 1000)  # the rest is never sent: nor waited for
        assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])


def test_a_form_with_a_file_or_too_many_fields_gets_400(deployment: Deployment) -> None:
    page = PageClient(deployment.base, {"X-Forwarded-For": "198.51.100.40"})
    csrf = csrf_of(page.get("/approvals").text, "/approvals/sign-in")
    cookies = "; ".join(f"{k}={v}" for k, v in page.cookies.items())
    upload = page.http.post(
        "/approvals/sign-in", data={"csrf": csrf}, files={"token": ("t.txt", b"x" * 1000)}, headers={"Cookie": cookies}
    )
    assert upload.status_code == 400 and "never sends" in upload.text, upload.text
    fields = {"csrf": csrf, "token": "x", **{f"f{i}": "1" for i in range(10)}}
    crowded = page.http.post("/approvals/sign-in", data=fields, headers={"Cookie": cookies})
    assert crowded.status_code == 400, crowded.text
    page.close()


@pytest.mark.store
def test_a_burst_of_bad_sign_ins_checks_no_more_than_the_limit_and_counts_each_forwarded_client(
    deployment: Deployment,
) -> None:
    client = {"X-Forwarded-For": "203.0.113.7"}
    page = PageClient(deployment.base, client)
    csrf = csrf_of(page.get("/approvals").text, "/approvals/sign-in")
    cookies = "; ".join(f"{k}={v}" for k, v in page.cookies.items())
    start = threading.Barrier(20)

    def attempt(i: int) -> int:
        with httpx.Client(base_url=deployment.base, timeout=60) as http:
            start.wait()
            form = {"csrf": csrf, "next": "/approvals", "token": f"not-a-token-{i}"}
            return http.post("/approvals/sign-in", data=form, headers={**client, "Cookie": cookies}).status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(attempt, range(20)))
    assert set(statuses) <= {401, 429} and statuses.count(401) <= LIMIT, statuses
    assert statuses.count(429) >= 20 - LIMIT, statuses
    assert page.sign_in(deployment.tokens["bob"]).status_code == 429  # this client waits its minute
    # Another person behind the same proxy is not locked out, and good sign-ins never count.
    other = PageClient(deployment.base, {"X-Forwarded-For": "203.0.113.8"})
    assert other.sign_in("not-a-token").status_code == 401
    for _ in range(LIMIT + 2):
        carol = signed_in(deployment, deployment.tokens["carol"], "203.0.113.8")
        carol.close()
    page.close()
    other.close()


def test_x_forwarded_for_from_a_peer_that_is_no_trusted_proxy_is_ignored(
    deployment: Deployment, tmp_path: Path
) -> None:
    port = free_port()
    # A key prefix of its own: the peer's attempt count is 127.0.0.1's, which other tests of the module
    # also count in a window of their own start; shared, its end could fall inside this test's five.
    server = deployment.serve(
        port,
        tmp_path / "server.log",
        MCP_CELERY_TRUSTED_PROXIES=None,
        MCP_CELERY_APPROVAL_SIGN_IN_LIMIT="3",
        MCP_CELERY_KEY_PREFIX=f"mcp-celery:xff-{port}",
    )
    try:
        statuses = []
        for i in range(5):  # each attempt claims another client: all are the peer, 127.0.0.1
            page = PageClient(f"http://127.0.0.1:{port}", {"X-Forwarded-For": f"192.0.2.{i + 1}"})
            statuses.append(page.sign_in("not-a-token").status_code)
            page.close()
        assert statuses == [401, 401, 401, 429, 429], statuses
    finally:
        server.stop()


def test_the_host_and_origin_checks_guard_the_page_and_the_downloads_too(deployment: Deployment) -> None:
    foreign = {"Host": "attacker.example"}
    for path in ("/approvals", "/approvals/style.css", "/artifacts/some-task/report.csv", "/mcp"):
        refused = httpx.get(deployment.base + path, headers=foreign, timeout=30)
        assert refused.status_code == 421 and "MCP_CELERY_ALLOWED_HOSTS" in refused.text, (path, refused.text)
    for origin in ("http://attacker.example", "null"):  # null: a sandboxed frame's, or a data: URL's
        posted = httpx.post(deployment.base + "/approvals/sign-in", data={"token": "x"}, headers={"Origin": origin})
        assert posted.status_code == 403 and f"'{origin}'" in posted.text, posted.text
    assert httpx.get(deployment.base + "/healthz", headers=foreign, timeout=30).status_code == 200  # a kubelet's


def test_a_cookie_or_csrf_token_that_is_not_ascii_gets_400_not_500(
    deployment: Deployment, approval_worker: Process, alice: HttpClient, bob_page: PageClient
) -> None:
    for name in ("mcp_celery_approvals", "mcp_celery_approvals_pre"):
        cookie = f"{name}=abc.\xe9\xe9".encode("latin-1")
        for method, path in (("GET", "/approvals"), ("POST", "/approvals/sign-in")):
            answer = httpx.request(method, deployment.base + path, headers={"Cookie": cookie}, data={"csrf": "x"})
            assert answer.status_code == 400, (name, path, answer.status_code, answer.text)
    task_id = alice.start("hold", {"n": 8, "approvers": ["bob"]}, **URL_ELICITATION)
    path = approval_path(waiting(alice, task_id))
    answer = bob_page.post(path, {"csrf": "\u00e9t\u00e9", "decision": "approve"})
    assert answer.status_code == 400 and "Content-Security-Policy" in answer.headers, answer.text
    assert alice.get(task_id)["status"] == "input_required"
    assert bob_page.decide(path, "approve").status_code == 303
    assert decided(alice, task_id) == "approved by bob"


def test_metrics_need_a_bearer_token_when_the_server_has_authentication(deployment: Deployment) -> None:
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        refused = httpx.get(deployment.base + "/metrics", headers=headers, timeout=30)
        assert refused.status_code == 401 and "mcp_celery_" not in refused.text, headers
    read = httpx.get(deployment.base + "/metrics", headers={"Authorization": f"Bearer {deployment.tokens['carol']}"})
    assert read.status_code == 200 and "mcp_celery_" in read.text
    assert deployment.server is not None
    assert "/metrics needs a bearer token" in deployment.server.output()  # the startup line says who may read
