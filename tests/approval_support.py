"""The approval tests' deployment: a private Redis, tokens for alice, bob and carol, a webhook receiver,
an approval policy (`POLICY`) and an HTTP server on a port chosen first (MCP_CELERY_PUBLIC_URL must name
it for the workers). The page client that signs in and posts forms as a browser would is
`mcp_celery.testing.approvals`."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.server.edge.tokens import new_token
from mcp_celery.testing.processes import free_port, start_redis
from tests import approval_jobs
from tests.support import HttpClient, Process, http_answers, start_worker

APP = "tests.approval_jobs"
PEOPLE = ("alice", "bob", "carol")
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
    base: str = ""  # http://127.0.0.1:PORT
    server: Process | None = None

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"

    def client(self, person: str) -> HttpClient:
        return HttpClient(self.mcp_url, self.tokens[person])

    def worker(self, log: Path, concurrency: int = 2, queues: str = approval_jobs.QUEUE) -> Process:
        name = f"approvals-{log.parent.name[-12:]}"
        return start_worker(self.env, log, app=APP, name=name, concurrency=concurrency, queues=queues)

    def serve(self, port: int, log: Path, **env: str) -> Process:
        """Start `mcp-celery serve --http` of this deployment on `port` (`env`: settings over its own)."""
        args = [sys.executable, "-m", "mcp_celery", "serve", "-A", APP, "--http", "--port", str(port)]
        server = Process(args, {**self.env, **env}, log)
        server.wait_ready(lambda: http_answers(f"http://127.0.0.1:{port}/mcp"), 60, "the HTTP server to answer")
        return server

    def restart_server(self) -> None:
        """Stop the deployment's server and start it again on its port."""
        assert self.server is not None
        self.server.stop()
        self.server = self.serve(int(self.base.rsplit(":", 1)[1]), self.folder / "server-again.log")


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("approvals")
    redis_url, redis_proc = start_redis(folder / "redis.log")
    tokens = {person: new_token(person, folder / "tokens") for person in PEOPLE}
    webhook = Webhook()
    receiver = webhook.serve()
    (folder / "policy.toml").write_text(POLICY)
    port = free_port()
    own = {k: v for k, v in env.items() if k != "MCP_CELERY_REDIS_URL"}
    deployed = Deployment(
        env={
            **own,
            "APPROVAL_BROKER_URL": f"{redis_url}/0",
            "APPROVAL_BACKEND_URL": f"{redis_url}/1",
            "MCP_CELERY_AUTH_TOKENS": str(folder / "tokens"),
            "MCP_CELERY_PUBLIC_URL": f"http://127.0.0.1:{port}/mcp",
            "MCP_CELERY_APPROVAL_WEBHOOK": webhook.url,
            "MCP_CELERY_APPROVAL_POLICY": str(folder / "policy.toml"),
            "RELEASE_APPROVERS": "alice,bob",
            "RELEASE_WORK_DIR": str(folder / "work"),
            "RELEASE_PUBLISH_DIR": str(folder / "published"),
        },
        folder=folder,
        tokens=tokens,
        webhook=webhook,
        base=f"http://127.0.0.1:{port}",
    )
    deployed.server = deployed.serve(port, folder / "server.log")
    yield deployed
    deployed.server.stop()
    receiver.shutdown()
    receiver.server_close()
    redis_proc.stop()
