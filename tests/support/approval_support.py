"""The approval tests' deployment: a private Redis (Celery's broker and results), tokens for alice, bob
and carol, JWTs of a local issuer, a webhook receiver, an approval policy (`POLICY`) and an HTTP server
on a port chosen first (MCP_CELERY_PUBLIC_URL must name it for the workers) that believes
X-Forwarded-For from loopback (MCP_CELERY_TRUSTED_PROXIES), so that a test can sign in as a client of
its own. mcp-celery's store is the session's in a store pass (MCP_CELERY_REDIS_URL: the ACL user, the
cluster; tests/conftest.py), else the private Redis. The page client that signs in and posts forms as a
browser would is `mcp_celery.testing.approvals`."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet

from mcp_celery.server.edge.tokens import new_token
from mcp_celery.testing.approvals import PageClient
from mcp_celery.testing.processes import free_port, start_redis, wait_for
from tests.support import approval_jobs
from tests.support.harness import HttpClient, Process, http_answers, require_service, start_worker

__all__ = [
    "APP",
    "POLICY",
    "Deployment",
    "alice_fixture",
    "approval_worker_fixture",
    "bob_page_fixture",
    "browser_fixture",
    "deployed",
    "deployment_fixture",
    "URL_ELICITATION",
    "signed_in",
    "waiting",
]

APP = "tests.support.approval_jobs"
#: The client capabilities of a client that shows its user an approval's link (URL-mode elicitation).
URL_ELICITATION = {"elicitation": {"url": {}}}
PEOPLE = ("alice", "bob", "carol")
#: The JWT issuer the server trusts (a local key), and the audience its tokens name.
ISSUER, AUDIENCE = "https://idp.approvals.test", "https://jobs.approvals.test/mcp"


class Issuer:
    """A local JWT issuer: its key, and the JWKS file the server reads."""

    def __init__(self, folder: Path) -> None:
        self.key = ECKey.generate_key("P-256", parameters={"kid": "approvals"})
        self.jwks = folder / "jwks.json"
        self.jwks.write_text(json.dumps(KeySet([self.key]).as_dict(private=False)))

    def jwt(self, sub: str, lasts_s: int) -> str:
        """A JWT for `sub` that expires `lasts_s` seconds from now."""
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now + lasts_s, "nbf": now - 5}
        return jwt.encode({"alg": "ES256", "kid": "approvals"}, claims, self.key)


#: MCP_CELERY_APPROVAL_POLICY of the deployment: the tools of `approval_jobs` it holds for approval.
POLICY = """\
[tools."deploy_*"]
approvers = ["bob", "carol"]
message = "Deploy {service} to {env}?"

[tools.restart_service]
approvers = ["bob"]
timeout_s = 3
"""


@dataclass
class Webhook:
    """A local receiver of the approval webhook: every POST's JSON body, in order."""

    bodies: list[dict[str, Any]] = field(default_factory=lambda: [])
    url: str = ""

    def serve(self) -> ThreadingHTTPServer:
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: none left open at the end

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@dataclass
class Deployment:
    env: dict[str, str]
    folder: Path
    tokens: dict[str, str]
    webhook: Webhook
    issuer: Issuer
    base: str = ""  # http://127.0.0.1:PORT
    server: Process | None = None

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"

    def client(self, person: str) -> HttpClient:
        return HttpClient(self.mcp_url, self.tokens[person])

    @property
    def token_file(self) -> Path:
        return self.folder / "tokens"

    def worker(self, log: Path, concurrency: int = 2, queues: str = approval_jobs.QUEUE, **env: str | None) -> Process:
        """A prefork worker of the approval jobs serving `queues`; `env`: settings over its own (None: unset)."""
        name = f"approvals-{log.parent.name[-12:]}"
        return start_worker(_over(self.env, env), log, app=APP, name=name, concurrency=concurrency, queues=queues)

    def serve(self, port: int, log: Path, **env: str | None) -> Process:
        """Start `mcp-celery serve --http` of this deployment on `port` (`env`: settings over its own; None: unset)."""
        args = [sys.executable, "-m", "mcp_celery", "serve", "-A", APP, "--http", "--port", str(port)]
        server = Process(args, _over(self.env, env), log)
        server.wait_ready(lambda: http_answers(f"http://127.0.0.1:{port}/mcp"), 60, "the HTTP server to answer")
        return server

    def restart_server(self) -> None:
        """Stop the deployment's server and start it again on its port."""
        assert self.server is not None
        self.server.stop()
        self.server = self.serve(int(self.base.rsplit(":", 1)[1]), self.folder / "server-again.log")


def _over(base: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    """`base` with `changes` over it; a change to None removes the setting."""
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(env, tmp_path_factory.mktemp("approvals")) as deployment:
        yield deployment


@contextmanager
def deployed(env: dict[str, str], folder: Path, settings: dict[str, str] | None = None) -> Iterator[Deployment]:
    """Redis, tokens, a JWT issuer, the webhook receiver and the HTTP server, with `settings` (MCP_CELERY_*
    and the release job's) over the defaults; all stopped at the end."""
    redis_url, redis_proc = start_redis(folder / "redis.log")
    tokens = {person: new_token(person, folder / "tokens") for person in PEOPLE}
    webhook = Webhook()
    receiver = webhook.serve()
    issuer = Issuer(folder)
    (folder / "policy.toml").write_text(POLICY)
    port = free_port()
    deployment = Deployment(
        env={
            **env,  # in a store pass, MCP_CELERY_REDIS_URL: the ACL user, or the cluster
            "APPROVAL_BROKER_URL": f"{redis_url}/0",
            "APPROVAL_BACKEND_URL": f"{redis_url}/1",
            "MCP_CELERY_AUTH_TOKENS": str(folder / "tokens"),
            "MCP_CELERY_JWT_JWKS": str(issuer.jwks),
            "MCP_CELERY_JWT_ISSUER": ISSUER,
            "MCP_CELERY_JWT_AUDIENCE": AUDIENCE,
            "MCP_CELERY_TRUSTED_PROXIES": "127.0.0.1",
            "MCP_CELERY_PUBLIC_URL": f"http://127.0.0.1:{port}/mcp",
            "MCP_CELERY_APPROVAL_WEBHOOK": webhook.url,
            "MCP_CELERY_APPROVAL_POLICY": str(folder / "policy.toml"),
            "RELEASE_APPROVERS": "alice,bob",
            "RELEASE_WORK_DIR": str(folder / "work"),
            "RELEASE_PUBLISH_DIR": str(folder / "published"),
            **(settings or {}),
        },
        folder=folder,
        tokens=tokens,
        webhook=webhook,
        issuer=issuer,
        base=f"http://127.0.0.1:{port}",
    )
    try:
        deployment.server = deployment.serve(port, folder / "server.log")
        yield deployment
    finally:
        if deployment.server is not None:
            deployment.server.stop()
        receiver.shutdown()
        receiver.server_close()
        redis_proc.stop()


@pytest.fixture(scope="module", name="approval_worker")
def approval_worker_fixture(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The module's worker of the approval jobs (queue `approvals`; not named `worker`, which the session's is)."""
    proc = deployment.worker(tmp_path_factory.mktemp("approval-worker") / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture(name="alice")
def alice_fixture(deployment: Deployment) -> Iterator[HttpClient]:
    """alice's MCP client: she calls the tools, and so asks every approval."""
    client = deployment.client("alice")
    yield client
    client.close()


@pytest.fixture(name="bob_page")
def bob_page_fixture(deployment: Deployment) -> Iterator[PageClient]:
    """bob, signed in on the approval page."""
    page = signed_in(deployment, deployment.tokens["bob"])
    yield page
    page.close()


def signed_in(deployment: Deployment, credential: str, client: str | None = None) -> PageClient:
    """A page client signed in with `credential` (a token or JWT), as the forwarded client `client`
    (None: loopback itself)."""
    page = PageClient(deployment.base, {"X-Forwarded-For": client} if client else None)
    answer = page.sign_in(credential)
    assert answer.status_code == 303, answer.text
    return page


@pytest.fixture(name="browser")
def browser_fixture() -> Iterator[Any]:
    """Debian's chromium, headless, driven by selenium through chromium-driver (.ci/run installs both)."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    require_service("chromium", f"{' and '.join(missing)} not installed" if missing else None)
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=820,1180"):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def waiting(client: HttpClient, task_id: str) -> dict[str, Any]:
    """The task once it asks (`input_required`)."""
    return client.wait(task_id, {"input_required"}, timeout=60)


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
