"""`mcp-celery serve` (MCP over stdio or Streamable HTTP) and `mcp-celery demo`. Wiring only."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

import anyio
import uvicorn
from celery import Celery
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette

from mcp_celery import auth, limits
from mcp_celery.demo import run_demo
from mcp_celery.errors import ConfigurationError
from mcp_celery.server import create_server
from mcp_celery.settings import Settings

__all__ = ["http_app", "load_app", "main"]

_APP_ENV, _HOST_ENV, _PORT_ENV = "MCP_CELERY_APP", "MCP_CELERY_HOST", "MCP_CELERY_PORT"


def load_app(spec: str) -> Celery:
    """Import `module` or `module:attribute` and return its Celery app, as `celery -A` does.

    Raises:
        ConfigurationError: nothing importable there, or no Celery app in it.
    """
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")  # like celery -A: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    candidates = [attribute] if attribute else ["app", "celery"]
    for name in candidates:
        found = getattr(module, name, None)
        if isinstance(found, Celery):
            return found
    apps = [v for v in vars(module).values() if isinstance(v, Celery)]
    if not attribute and len(apps) == 1:
        return apps[0]
    raise ConfigurationError(
        f"no Celery app {'named ' + repr(attribute) if attribute else ''} found in {module_name!r}"
    )


def http_app() -> Starlette:
    """ASGI app factory for `serve --http`; with `--workers N` each worker process builds its own server."""
    settings = Settings()
    server = create_server(load_app(os.environ[_APP_ENV]), settings)
    options = auth.http_app_options(settings, os.environ[_HOST_ENV], int(os.environ[_PORT_ENV]))
    return server.streamable_http_app(stateless_http=True, json_response=True, **options)


def serve(
    app_spec: str, *, http: bool, host: str, port: int, workers: int, allow_unauthenticated: bool = False
) -> None:
    if http:
        auth.check_exposure(Settings(), host, allow_unauthenticated=allow_unauthenticated)
        os.environ[_APP_ENV], os.environ[_HOST_ENV], os.environ[_PORT_ENV] = app_spec, host, str(port)
        # Task state lives in Redis only, so any worker process can answer for any task.
        target = "mcp_celery.cli:http_app" if workers > 1 else http_app()
        uvicorn.run(target, factory=workers > 1, host=host, port=port, workers=workers, log_level="warning")
        return
    server = create_server(load_app(app_spec), Settings())

    async def run_stdio() -> None:
        async with stdio_server() as (read, write):
            answering = limits.AnswerUnreadable(read, write)  # -32700/-32600 for unreadable lines
            await server.run(answering, write, server.create_initialization_options())

    anyio.run(run_stdio)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-celery", description="Celery jobs as MCP tools (SEP-2663 tasks).")
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the app's tools over MCP (stdio by default)")
    run.add_argument("-A", "--app", required=True, help="module or module:app holding the Celery app, as celery -A")
    run.add_argument(
        "--http", action="store_true", help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio"
    )
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8000)
    run.add_argument("--workers", type=int, default=1, help="HTTP server processes (default 1)")
    run.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --host without MCP_CELERY_AUTH_TOKENS or MCP_CELERY_JWT_JWKS",
    )
    token = commands.add_parser("token", help="manage static bearer tokens (MCP_CELERY_AUTH_TOKENS)")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    new = token_commands.add_parser("new", help="print a new token for PRINCIPAL once; append its digest to the file")
    new.add_argument("principal")
    new.add_argument("--file", help="token file (default: $MCP_CELERY_AUTH_TOKENS)")
    demo = commands.add_parser("demo", help="start Redis if needed, a worker and the server, and walk through the demo")
    demo.add_argument("--port", type=int, default=8000, help="HTTP port of the demo server (default 8000)")
    demo.add_argument("--serve", action="store_true", help="keep serving after the walkthrough, until Ctrl-C")
    return parser


def _token_file(given: str | None) -> Path:
    path = given or Settings().auth_tokens
    if not path:
        raise ConfigurationError("no token file: pass --file PATH or set MCP_CELERY_AUTH_TOKENS")
    return Path(path)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        if args.command == "serve":
            load_app(args.app)  # fail early, with a clear message, before any worker process starts
            serve(
                args.app,
                http=args.http,
                host=args.host,
                port=args.port,
                workers=args.workers,
                allow_unauthenticated=args.allow_unauthenticated,
            )
        elif args.command == "token":
            print(auth.new_token(args.principal, _token_file(args.file)))
        else:
            sys.exit(run_demo(port=args.port, keep_serving=args.serve))
    except ConfigurationError as exc:
        print(f"mcp-celery: {exc}", file=sys.stderr)
        sys.exit(2)
