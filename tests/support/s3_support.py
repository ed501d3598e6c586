"""An S3-compatible server for the artifact tests: moto's (`moto[server]`), on a free loopback port.

The workers and servers reach it as a user reaches any S3-compatible endpoint: `AWS_ENDPOINT_URL`
and the `AWS_*` credentials in their environment, `MCP_CELERY_ARTIFACTS=s3://bucket/prefix`
(docs/guides/artifacts.md). `MCP_CELERY_TEST_ARTIFACTS=s3` runs the artifact tests whose outcome
depends on the store (`-m artifact_store`) against it instead of Redis and a folder: the S3 pass of
`.ci/run`.

With `auth=True` moto checks every request's credentials against its own IAM users (there are
none), so any key is refused: the test of refused credentials. (Only then: moto's signature check
refuses listings with a prefix even for good credentials, getmoto/moto#5948.)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from mcp_celery.testing.processes import Process, free_port
from tests.support.harness import require_service

__all__ = ["ARTIFACTS_ENV", "S3_VARIANT", "S3Server", "start_s3"]

#: `MCP_CELERY_TEST_ARTIFACTS=s3`: the artifact tests keep artifacts on the S3 server (the S3 pass).
ARTIFACTS_ENV = "MCP_CELERY_TEST_ARTIFACTS"
S3_VARIANT = os.environ.get(ARTIFACTS_ENV, "") == "s3"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mcp-celery-tests", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}


@dataclass
class S3Server:
    endpoint: str
    process: Process

    @property
    def env(self) -> dict[str, str]:
        """What a worker or a server needs to reach it, as users give it."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1", **_CREDENTIALS}

    def make_bucket(self, name: str) -> None:
        answer = httpx.put(f"{self.endpoint}/{name}", timeout=30)  # moto without auth takes an unsigned PUT
        assert answer.status_code == 200, answer.text

    def stop(self) -> None:
        self.process.stop()


def start_s3(folder: Path, *, auth: bool = False) -> S3Server:
    """moto's S3 server on a free loopback port, once it answers; skips (or fails, where required) without moto."""
    missing = [name for name in ("moto", "flask", "s3fs") if importlib.util.find_spec(name) is None]
    require_service("s3", f"{', '.join(missing)} not installed (pip install 'moto[server]' s3fs)" if missing else None)
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else dict(os.environ)
    args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = Process(args, env, folder / f"moto-{port}.log")
    endpoint = f"http://127.0.0.1:{port}"
    process.wait_ready(lambda: _answers(endpoint), 60, "moto's S3 server to answer")
    return S3Server(endpoint, process)


def _answers(endpoint: str) -> bool:
    try:
        return httpx.get(f"{endpoint}/moto-api/", timeout=1).status_code < 500
    except httpx.HTTPError:
        return False
