"""The Streamable HTTP ASGI app of `mcp-celery serve --http`.

Server tier. Every 2026-07-28 request is a stateless POST, so any number of server processes
(`--workers N`) or replicas serve the same tasks: task state lives in Redis only.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette

from mcp_celery.celery_app import load_app
from mcp_celery.server import auth
from mcp_celery.server.app import create_server
from mcp_celery.settings import Settings

__all__ = ["APP_ENV", "HOST_ENV", "PORT_ENV", "http_app", "http_app_from_env"]

#: How `serve --http --workers N` hands the app, host and port to each uvicorn worker process.
APP_ENV, HOST_ENV, PORT_ENV = "MCP_CELERY_APP", "MCP_CELERY_HOST", "MCP_CELERY_PORT"


def http_app(app_spec: str, host: str, port: int) -> Starlette:
    """The ASGI app serving the tools of the Celery app at `app_spec` (`module` or `module:app`).

    With authentication configured, requests need a valid bearer token (401 otherwise) and the
    RFC 9728 protected resource metadata is served; Host and Origin are checked in any case.
    """
    settings = Settings()
    server = create_server(load_app(app_spec), settings)
    options = auth.http_app_options(settings, host, port)
    return server.streamable_http_app(stateless_http=True, json_response=True, **options)


def http_app_from_env() -> Starlette:
    """ASGI app factory for `serve --http --workers N`: each worker process builds its own server."""
    return http_app(os.environ[APP_ENV], os.environ[HOST_ENV], int(os.environ[PORT_ENV]))
