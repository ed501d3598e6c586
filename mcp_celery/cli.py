"""`mcp-celery serve` (MCP over stdio or Streamable HTTP) and `mcp-celery demo`. Wiring only.

Each subcommand imports its tier only when it runs, so `mcp-celery --help` loads neither
Celery nor the MCP server.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from mcp_celery.errors import ConfigurationError

__all__ = ["main"]


def serve(app_spec: str, *, http: bool, host: str, port: int, workers: int) -> None:
    from mcp_celery.celery_app import load_app

    load_app(app_spec)  # fail early, with a clear message, before any worker process starts
    if http:
        _serve_http(app_spec, host, port, workers)
    else:
        _serve_stdio(app_spec)


def _serve_http(app_spec: str, host: str, port: int, workers: int) -> None:
    import uvicorn

    from mcp_celery.server import http

    os.environ[http.APP_ENV], os.environ[http.HOST_ENV] = app_spec, host
    # Task state lives in Redis only, so any worker process can answer for any task.
    target = "mcp_celery.server.http:http_app_from_env" if workers > 1 else http.http_app(app_spec, host)
    uvicorn.run(target, factory=workers > 1, host=host, port=port, workers=workers, log_level="warning")


def _serve_stdio(app_spec: str) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    from mcp_celery.celery_app import load_app
    from mcp_celery.server import create_server
    from mcp_celery.settings import Settings

    server = create_server(load_app(app_spec), Settings())

    async def run_stdio() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

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
    demo = commands.add_parser("demo", help="start Redis if needed, a worker and the server, and walk through the demo")
    demo.add_argument("--port", type=int, default=8000, help="HTTP port of the demo server (default 8000)")
    demo.add_argument("--serve", action="store_true", help="keep serving after the walkthrough, until Ctrl-C")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        if args.command == "serve":
            serve(args.app, http=args.http, host=args.host, port=args.port, workers=args.workers)
        else:
            from mcp_celery.demo import run_demo

            sys.exit(run_demo(port=args.port, keep_serving=args.serve))
    except ConfigurationError as exc:
        print(f"mcp-celery: {exc}", file=sys.stderr)
        sys.exit(2)
