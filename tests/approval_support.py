"""The approval tests' deployment: a private Redis, tokens for alice, bob and carol, a webhook receiver and
an HTTP server on a port chosen first (MCP_CELERY_PUBLIC_URL must name it for the workers). The page
client that signs in and posts forms as a browser would is `mcp_celery.testing.approvals`."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.server.edge.tokens import new_token
from mcp_celery.testing.processes import free_port, start_redis
from tests import approval_jobs
from tests.support import HttpClient, Process, http_answers, require_service, start_worker

APP = "tests.approval_jobs"
PEOPLE = ("alice", "bob", "carol")


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
    base: str = ""  # http://127.0.0.1:PORT
    server: Process | None = None

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"

    def client(self, person: str) -> HttpClient:
        return HttpClient(self.mcp_url, self.tokens[person])

    def worker(self, log: Path, concurrency: int = 2) -> Process:
        name = f"approvals-{log.parent.name[-12:]}"
        return start_worker(self.env, log, app=APP, name=name, concurrency=concurrency, queues=approval_jobs.QUEUE)


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(env, tmp_path_factory.mktemp("approvals")) as deployment:
        yield deployment


@contextmanager
def deployed(env: dict[str, str], folder: Path, settings: dict[str, str] | None = None) -> Iterator[Deployment]:
    """Redis, tokens, the webhook receiver and the HTTP server, with `settings` (MCP_CELERY_* and the
    release job's) over the defaults; all stopped at the end."""
    redis_url, redis_proc = start_redis(folder / "redis.log")
    tokens = {person: new_token(person, folder / "tokens") for person in PEOPLE}
    webhook = Webhook()
    receiver = webhook.serve()
    port = free_port()
    own = {k: v for k, v in env.items() if k != "MCP_CELERY_REDIS_URL"}
    deployment = Deployment(
        env={
            **own,
            "APPROVAL_BROKER_URL": f"{redis_url}/0",
            "APPROVAL_BACKEND_URL": f"{redis_url}/1",
            "MCP_CELERY_AUTH_TOKENS": str(folder / "tokens"),
            "MCP_CELERY_PUBLIC_URL": f"http://127.0.0.1:{port}/mcp",
            "MCP_CELERY_APPROVAL_WEBHOOK": webhook.url,
            "RELEASE_APPROVERS": "alice,bob",
            "RELEASE_WORK_DIR": str(folder / "work"),
            "RELEASE_PUBLISH_DIR": str(folder / "published"),
            **(settings or {}),
        },
        folder=folder,
        tokens=tokens,
        webhook=webhook,
        base=f"http://127.0.0.1:{port}",
    )
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", APP, "--http", "--port", str(port)]
    server = deployment.server = Process(args, deployment.env, folder / "server.log")
    try:
        server.wait_ready(lambda: http_answers(deployment.mcp_url), 60, "the HTTP server to answer")
        yield deployment
    finally:
        server.stop()
        receiver.shutdown()
        receiver.server_close()
        redis_proc.stop()


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
