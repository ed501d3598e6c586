"""The OpenID Connect tests' deployment: the approval tests' one (`tests/support/approval_support.py`) signing
people in at a real provider on loopback (`mcp_celery.testing.oidc_provider`, PKCE enforced), reached as
`localhost` while the page is `127.0.0.1`: another site, as a company's provider is."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_celery.testing.oidc_provider import start_provider
from tests.support.approval_support import Deployment, deployed
from tests.support.harness import Process, require_service

CLIENT_ID = "mcp-celery-approvals"
PROVIDER_NAME = "Test IdP"


@dataclass
class Provider:
    issuer: str
    process: Process

    def tamper(self, mode: str) -> None:
        """Have the provider's next ID token altered (`mcp_celery.testing.oidc_provider.TAMPER_MODES`)."""
        httpx.post(f"{self.issuer}/_test/tamper", json={"mode": mode}, timeout=10).raise_for_status()

    def pkce(self) -> dict[str, int]:
        """The code exchanges whose PKCE verifier the provider checked, and those it refused."""
        counts: dict[str, int] = httpx.get(f"{self.issuer}/_test/pkce", timeout=10).json()
        return counts

    def metadata(self) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=10).json()
        return found


@pytest.fixture(scope="module", name="provider")
def provider_fixture(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    missing = importlib.util.find_spec("oidc_provider_mock") is None
    require_service("oidc-provider", "oidc-provider-mock is not installed (the [dev] extra)" if missing else None)
    issuer, proc = start_provider(tmp_path_factory.mktemp("oidc-provider") / "provider.log", env)
    yield Provider(issuer, proc)
    proc.stop()


def oidc_settings(issuer: str, folder: Path, **more: str) -> dict[str, str]:
    """The settings of a server that signs people in at `issuer`, its client secret in a file of `folder`."""
    secret = folder / "oidc-client-secret"
    secret.write_text("a-client-secret-never-in-the-environment\n")
    secret.chmod(0o600)
    return {
        "MCP_CELERY_OIDC_ISSUER": issuer,
        "MCP_CELERY_OIDC_CLIENT_ID": CLIENT_ID,
        "MCP_CELERY_OIDC_CLIENT_SECRET_FILE": str(secret),
        "MCP_CELERY_OIDC_PROVIDER_NAME": PROVIDER_NAME,
        # The tests sign in and are refused many times a minute from one address (the limit has its own test).
        "MCP_CELERY_APPROVAL_SIGN_IN_LIMIT": "1000",
        **more,
    }


@pytest.fixture(scope="module", name="oidc_deployment")
def oidc_deployment_fixture(
    env: dict[str, str], provider: Provider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("oidc-approvals")
    with deployed(env, folder, oidc_settings(provider.issuer, folder)) as deployment:
        yield deployment


@pytest.fixture(scope="module", name="oidc_worker")
def oidc_worker_fixture(oidc_deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A prefork worker of the approval jobs for the OpenID Connect deployment."""
    proc = oidc_deployment.worker(tmp_path_factory.mktemp("oidc-worker") / "worker.log")
    yield proc
    proc.stop()
