"""The operator's HTTP routes: `/healthz`, `/readyz` and `/metrics`, outside the MCP endpoint.

Server tier. An ASGI app in front of the MCP app: these three paths are answered here, before the
SDK's Host check and bearer-token authentication (a kubelet or Prometheus has no MCP token, and
sends the pod's address as Host); every other request goes on to the MCP app untouched.

* `GET /healthz`: 200 while the process serves HTTP; nothing else is asked.
* `GET /readyz`: 200 while the store's Redis and the broker answer (`mcp_celery.server.ops.probes`),
  else 503 with a JSON body naming what failed.
* `GET /metrics`: the Prometheus text exposition (`mcp_celery.server.ops.metrics`); with
  MCP_CELERY_METRICS_TOKEN it needs `Authorization: Bearer <token>` (401 otherwise). Not served
  with MCP_CELERY_METRICS=false, nor on the MCP port when `--metrics-port` serves it elsewhere.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_celery.server.ops import metrics
from mcp_celery.server.ops.probes import Readiness
from mcp_celery.settings import Settings

__all__ = ["HEALTH_PATH", "METRICS_PATH", "READY_PATH", "OperationsRoutes"]

HEALTH_PATH, READY_PATH, METRICS_PATH = "/healthz", "/readyz", "/metrics"
_JSON = b"application/json"
#: Extra response headers, as ASGI carries them.
ExtraHeaders = Sequence[tuple[bytes, bytes]]


class OperationsRoutes:
    """Answers the probe and metrics paths itself; passes every other request to `app` (404 without one)."""

    def __init__(self, app: ASGIApp | None, readiness: Readiness, settings: Settings, *, serve_metrics: bool) -> None:
        self.app = app
        self.readiness = readiness
        self.serve_metrics = serve_metrics and settings.metrics
        token = settings.metrics_token
        self._expected = f"Bearer {token.get_secret_value()}".encode() if token else None

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
        if self._expected is not None:
            given = (Headers(scope=scope).get("authorization") or "").encode()
            if not hmac.compare_digest(given, self._expected):
                body = {"error": "GET /metrics needs Authorization: Bearer <MCP_CELERY_METRICS_TOKEN>"}
                await self._answer(scope, send, 401, body, [(b"www-authenticate", b"Bearer")])
                return
        text = await anyio.to_thread.run_sync(metrics.exposition)  # files and collectors' I/O: off the loop
        await _send(scope, send, 200, CONTENT_TYPE_LATEST.encode(), text)

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
