"""The Streamable HTTP ASGI app of `mcp-celery serve --http`.

Server tier. Every 2026-07-28 request is a stateless POST, so any number of server processes
(`--workers N`) or replicas serve the same tasks: task state lives in Redis only.

Two SDK apps serve the one server: one answers every request with plain JSON, the other may answer
with an SSE stream, which is what lets a request receive notifications (`notifications/progress`
while a plain call waits for its job). SSE costs every request the SDK's streaming machinery
(measured: about half a millisecond of CPU and more latency per `tools/call`), so only a POST whose
body carries a `progressToken` takes the streaming app; `subscriptions/listen` streams in either.

`GET /artifacts/{taskId}/{name}` (`mcp_celery.server.downloads`) is a route of the JSON app, where
every GET goes, authenticated with the MCP endpoint's own token verifier.

Beside them, `/approvals` is the approval page (`mcp_celery.server.approvals`), over the same task
service. In front of all of them, the Host and Origin check (`mcp_celery.server.edge.hosts`); in
front of that, `/healthz`, `/readyz` and `/metrics` are answered outside the MCP endpoint, its Host
check and its authentication (`mcp_celery.server.ops.operations`; /metrics has its own).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AsyncExitStack
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp

from mcp_celery.core.celery_app import load_app
from mcp_celery.server.app import serving
from mcp_celery.server.approvals import approval_app, oidc_client
from mcp_celery.server.downloads import Downloads
from mcp_celery.server.edge import auth, handshake
from mcp_celery.server.edge.hosts import HostCheck
from mcp_celery.server.edge.refusals import RewordedRefusals
from mcp_celery.server.ops import metrics
from mcp_celery.server.ops.operations import OperationsRoutes
from mcp_celery.server.ops.probes import Readiness
from mcp_celery.server.resources import DOWNLOAD_PATH
from mcp_celery.settings import Settings

__all__ = [
    "APP_ENV",
    "HOST_ENV",
    "PORT_ENV",
    "PathRouter",
    "ProgressRouter",
    "http_app",
    "http_app_from_env",
    "metrics_app",
]

#: How `serve --http --workers N` hands the app, host and port to each uvicorn worker process.
APP_ENV, HOST_ENV, PORT_ENV = "MCP_CELERY_APP", "MCP_CELERY_HOST", "MCP_CELERY_PORT"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: How a request asks for progress notifications (`params._meta.progressToken`), as bytes in its body.
_PROGRESS_TOKEN = b'"progressToken"'
#: How an `initialize` request names its method, as bytes in its body.
_INITIALIZE = b'"initialize"'


def http_app(app_spec: str, host: str, port: int, settings: Settings | None = None) -> ASGIApp:
    """The ASGI app serving the tools of the Celery app at `app_spec` (`module` or `module:app`).

    With authentication configured, requests need a valid bearer token (401 otherwise) and the
    RFC 9728 protected resource metadata is served; Host and Origin are checked in any case.
    The SDK's bare refusals (413, 421, 403, JSON that is not JSON-RPC) are reworded to say
    what to set (`mcp_celery.server.edge.refusals`).

    Raises:
        ConfigurationError: the app cannot back MCP tasks, or the authentication settings are incomplete.
    """
    settings = settings or Settings()  # given by `serve`; built here once per server process of --workers N
    metrics.configure(settings)
    celery_app = load_app(app_spec)
    server, service = serving(celery_app, settings)
    options = auth.http_app_options(settings, host, port)
    verifier: auth.Verifiers | None = options.get("token_verifier")
    service.gate.public_url = auth.public_url(settings, host, port)  # the approval page a held call links to
    # GET /artifacts/{taskId}/{name}: artifacts of any size, with /mcp's credentials (`downloads`).
    download = Route(DOWNLOAD_PATH, Downloads(service, verifier).endpoint, methods=["GET"])
    json_app = server.streamable_http_app(
        stateless_http=True, json_response=True, custom_starlette_routes=[download], **options
    )
    streaming_app = server.streamable_http_app(stateless_http=True, json_response=False, **options)
    # The SDK's bare refusals (413, 421, 403, a body that is not JSON-RPC) say what to do.
    mcp: ASGIApp = RewordedRefusals(ProgressRouter(json_app, streaming_app, settings.max_request_bytes), settings)
    if verifier is not None:
        mcp = auth.CountedRefusals(mcp)
    # The approval page (`/approvals`) signs people in with the same verifier, and with the OpenID Connect
    # provider when one is configured; its lifespan is the MCP app's.
    oidc = oidc_client(settings, auth.public_url(settings, host, port))
    mcp = PathRouter({"/approvals": approval_app(service, verifier, oidc)}, mcp)
    # DNS rebinding: Host and Origin are checked for /mcp, /approvals and /artifacts alike.
    mcp = HostCheck(mcp, settings)
    # The probes and /metrics answer before the Host check and the MCP app's authentication.
    readiness = Readiness(celery_app, settings)
    metrics_here = settings.metrics_port is None
    return OperationsRoutes(mcp, readiness, settings, serve_metrics=metrics_here, verifier=verifier)


def metrics_app(app_spec: str, settings: Settings, host: str, port: int) -> ASGIApp:
    """The ASGI app of `--metrics-port`: /metrics, /healthz and /readyz only (404 for the rest).

    It runs in the process that started the server processes: /metrics sums theirs (multiprocess
    mode) or, with a single process, shows that process's own. /metrics asks what it asks on the MCP
    port (`host`, `port`: the MCP endpoint's, whose verifier it uses).
    """
    metrics.configure(settings)
    verifier = auth.build_verifier(settings, auth.public_url(settings, host, port))
    readiness = Readiness(load_app(app_spec), settings)
    return OperationsRoutes(None, readiness, settings, serve_metrics=True, verifier=verifier)


def http_app_from_env() -> ASGIApp:
    """ASGI app factory for `serve --http --workers N`: each worker process builds its own server."""
    return http_app(os.environ[APP_ENV], os.environ[HOST_ENV], int(os.environ[PORT_ENV]))


class PathRouter:
    """Sends the HTTP requests under each prefix to its app, everything else (and the lifespan) to `default`."""

    def __init__(self, prefixes: dict[str, ASGIApp], default: ASGIApp) -> None:
        self.prefixes = prefixes
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = str(scope.get("path", ""))
            for prefix, app in self.prefixes.items():
                if path == prefix or path.startswith(prefix + "/"):
                    await app(scope, receive, send)
                    return
        await self.default(scope, receive, send)


class ProgressRouter:
    """Sends a POST that asks for progress to the streaming app, every other request to the JSON app.

    Both apps' lifespans run, nested, in this app's one lifespan; they enter the same server
    lifespan, which `create_server` makes shared (started once, stopped by the last to leave).
    """

    def __init__(self, json_app: Starlette, streaming_app: Starlette, max_body_bytes: int) -> None:
        self.json_app = json_app
        self.streaming_app = streaming_app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] != "http" or scope.get("method") != "POST":
            await self.json_app(scope, receive, send)
        else:
            await self._post(scope, receive, send)

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Read at most one byte over the limit: a larger body goes on to the JSON app, which answers 413.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and size <= self.max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":  # the client went away while sending
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        app = self.streaming_app if _PROGRESS_TOKEN in body else self.json_app
        # An initialize-era client's declaration rides in its session id (`handshake`).
        if _INITIALIZE in body and (session := handshake.session_id(body)) is not None:
            send = handshake.with_session_id(send, session)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the rest of the body, if any, then http.disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": more}

        await app(scope, replay, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The ASGI lifespan protocol, running both apps' lifespans for as long as the server runs."""
        await receive()  # lifespan.startup
        async with AsyncExitStack() as stack:
            try:
                for app in (self.json_app, self.streaming_app):
                    await stack.enter_async_context(app.router.lifespan_context(app))
            except Exception as exc:  # noqa: BLE001 - reported to the ASGI server, which logs it and exits
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                raise
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        metrics.process_stopped()
        await send({"type": "lifespan.shutdown.complete"})
