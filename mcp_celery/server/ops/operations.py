"""The operator's HTTP routes: `/healthz`, `/readyz` and `/metrics`, outside the MCP endpoint.

Server tier. An ASGI app in front of the MCP app: these three paths are answered here, before the
SDK's Host check and bearer-token authentication (a kubelet or Prometheus has no MCP token, and
sends the pod's address as Host); every other request goes on to the MCP app untouched.

* `GET /healthz`: 200 while the process serves HTTP; nothing else is asked.
* `GET /readyz`: 200 while the store's Redis and the broker answer (`mcp_celery.server.ops.probes`),
  else 503 with a JSON body naming what failed.
* `GET /metrics`: the Prometheus text exposition (`mcp_celery.server.ops.metrics`); with
  MCP_CELERY_METRICS_TOKEN it needs `Authorization: Bearer <token>`, else, on a server with
  authentication, a bearer token that /mcp accepts (401 otherwise); open only on a server without
  either, which the startup line says (`metrics_access`). Not served with MCP_CELERY_METRICS=false,
  nor on the MCP port when `--metrics-port` serves it elsewhere.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence

import anyio.to_thread
from mcp.server.auth.provider import TokenVerifier
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_celery.server.ops import metrics
from mcp_celery.server.ops.probes import Readiness
from mcp_celery.settings import Settings

__all__ = ["HEALTH_PATH", "METRICS_PATH", "READY_PATH", "OperationsRoutes", "metrics_access"]

HEALTH_PATH, READY_PATH, METRICS_PATH = "/healthz", "/readyz", "/metrics"
_JSON = b"application/json"
#: Extra response headers, as ASGI carries them.
ExtraHeaders = Sequence[tuple[bytes, bytes]]


class OperationsRoutes:
    """Answers the probe and metrics paths itself; passes every other request to `app` (404 without one)."""

    def __init__(
        self,
        app: ASGIApp | None,
        readiness: Readiness,
        settings: Settings,
        *,
        serve_metrics: bool,
        verifier: TokenVerifier | None = None,
    ) -> None:
        self.app = app
        self.readiness = readiness
        self.serve_metrics = serve_metrics and settings.metrics
        token = settings.metrics_token
        self._expected = f"Bearer {token.get_secret_value()}".encode() if token else None
        #: Without a metrics token, the server's own verifier: with authentication, /metrics is never open.
        self._verifier = verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == HEALTH_PATH:
            await self._answer(scope, send, 200, {"status": "ok"})
        elif path == READY_PATH:
            await self._ready(scope, send)
        elif path == METRICS_PATH and self.serve_metrics:
            await self._metrics(scope, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await self._answer(scope, send, 404, {"error": "not found"})

    async def _ready(self, scope: Scope, send: Send) -> None:
        if not await self._readable(scope, send):
            return
        verdict = await self.readiness.verdict()
        await self._answer(scope, send, 200 if verdict.ready else 503, verdict.body())

    async def _metrics(self, scope: Scope, send: Send) -> None:
        if not await self._readable(scope, send):
            return
        if not await self._authorized(Headers(scope=scope).get("authorization") or ""):
            wanted = "MCP_CELERY_METRICS_TOKEN" if self._expected is not None else "a token /mcp accepts"
            body = {"error": f"GET /metrics needs Authorization: Bearer <{wanted}>"}
            await self._answer(scope, send, 401, body, [(b"www-authenticate", b"Bearer")])
            return
        text = await anyio.to_thread.run_sync(metrics.exposition)  # files and collectors' I/O: off the loop
        await _send(scope, send, 200, CONTENT_TYPE_LATEST.encode(), text)

    async def _authorized(self, given: str) -> bool:
        if self._expected is not None:
            return hmac.compare_digest(given.encode(), self._expected)
        if self._verifier is None:
            return True
        scheme, _, token = given.partition(" ")
        return (
            scheme.lower() == "bearer" and bool(token) and await self._verifier.verify_token(token.strip()) is not None
        )

    async def _readable(self, scope: Scope, send: Send) -> bool:
        """Whether the request is a GET or HEAD; answers 405 otherwise."""
        if scope.get("method") in ("GET", "HEAD"):
            return True
        await self._answer(scope, send, 405, {"error": "GET only"}, [(b"allow", b"GET, HEAD")])
        return False

    async def _answer(
        self, scope: Scope, send: Send, status: int, body: Mapping[str, object], headers: ExtraHeaders = ()
    ) -> None:
        await _send(scope, send, status, _JSON, json.dumps(body).encode(), headers)


async def _send(
    scope: Scope, send: Send, status: int, content_type: bytes, body: bytes, headers: ExtraHeaders = ()
) -> None:
    all_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})


def metrics_access(settings: Settings) -> str:
    """What GET /metrics asks of a scraper, as `serve --http`'s startup line says it."""
    where = f"/metrics on port {settings.metrics_port}" if settings.metrics_port else "/metrics"
    if not settings.metrics:
        return "no /metrics"
    if settings.metrics_token:
        return f"{where} needs MCP_CELERY_METRICS_TOKEN"
    if settings.auth_tokens or settings.jwt_jwks:
        return f"{where} needs a bearer token"
    return f"{where} open, no authentication configured"
