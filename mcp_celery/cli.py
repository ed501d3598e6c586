"""`mcp-celery serve` (MCP over stdio or Streamable HTTP) and `mcp-celery demo`. Wiring only."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

import anyio
import uvicorn
from celery import Celery
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette

from mcp_celery.demo import run_demo
from mcp_celery.errors import ConfigurationError
from mcp_celery.server import create_server
from mcp_celery.settings import Settings

__all__ = ["http_app", "load_app", "main"]

_APP_ENV, _HOST_ENV = "MCP_CELERY_APP", "MCP_CELERY_HOST"


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
    server = create_server(load_app(os.environ[_APP_ENV]), Settings())
    return server.streamable_http_app(stateless_http=True, json_response=True, host=os.environ[_HOST_ENV])


def serve(app_spec: str, *, http: bool, host: str, port: int, workers: int) -> None:
    if http:
        os.environ[_APP_ENV], os.environ[_HOST_ENV] = app_spec, host
        # Task state lives in Redis only, so any worker process can answer for any task.
        target = "mcp_celery.cli:http_app" if workers > 1 else http_app()
        uvicorn.run(target, factory=workers > 1, host=host, port=port, workers=workers, log_level="warning")
        return
    server = create_server(load_app(app_spec), Settings())

    async def run_stdio() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run_stdio)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-celery",
        description="Celery jobs as MCP tools (SEP-2663 tasks).",
        epilog="client commands (any SEP-2663 server): mcp-celery call --help, mcp-celery tasks --help",
    )
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
    demo = commands.add_parser("demo", help="start Redis if needed, a worker and the server, and walk through the demo")
    demo.add_argument("--port", type=int, default=8000, help="HTTP port of the demo server (default 8000)")
    demo.add_argument("--serve", action="store_true", help="keep serving after the walkthrough, until Ctrl-C")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["call"], ["tasks"]):
        from mcp_celery.client import _cli as client_cli  # lazily: the client commands need no server code

        sys.exit(client_cli.main(argv))
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        if args.command == "serve":
            load_app(args.app)  # fail early, with a clear message, before any worker process starts
            serve(args.app, http=args.http, host=args.host, port=args.port, workers=args.workers)
        else:
            sys.exit(run_demo(port=args.port, keep_serving=args.serve))
    except ConfigurationError as exc:
        print(f"mcp-celery: {exc}", file=sys.stderr)
        sys.exit(2)
