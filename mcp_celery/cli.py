"""`mcp-celery serve` (MCP over stdio or Streamable HTTP) and `mcp-celery demo`. Wiring only.

Each subcommand imports its tier only when it runs, so `mcp-celery --help` loads neither
Celery nor the MCP server.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from mcp_celery.errors import ConfigurationError

__all__ = ["main"]


def serve(
    app_spec: str, *, http: bool, host: str, port: int, workers: int, allow_unauthenticated: bool = False
) -> None:
    from mcp_celery.celery_app import load_app

    load_app(app_spec)  # fail early, with a clear message, before any worker process starts
    if http:
        _serve_http(app_spec, host, port, workers, allow_unauthenticated)
    else:
        _serve_stdio(app_spec)


def _serve_http(app_spec: str, host: str, port: int, workers: int, allow_unauthenticated: bool) -> None:
    import uvicorn

    from mcp_celery.server import auth, http
    from mcp_celery.settings import Settings

    auth.check_exposure(Settings(), host, allow_unauthenticated=allow_unauthenticated)
    os.environ[http.APP_ENV], os.environ[http.HOST_ENV], os.environ[http.PORT_ENV] = app_spec, host, str(port)
    # Task state lives in Redis only, so any worker process can answer for any task.
    target = "mcp_celery.server.http:http_app_from_env" if workers > 1 else http.http_app(app_spec, host, port)
    uvicorn.run(target, factory=workers > 1, host=host, port=port, workers=workers, log_level="warning")


def _serve_stdio(app_spec: str) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    from mcp_celery.celery_app import load_app
    from mcp_celery.server import create_server, limits
    from mcp_celery.settings import Settings

    server = create_server(load_app(app_spec), Settings())

    async def run_stdio() -> None:
        async with stdio_server() as (read, write):
            answering = limits.AnswerUnreadable(read, write)  # -32700/-32600 for unreadable lines
            await server.run(answering, write, server.create_initialization_options())

    anyio.run(run_stdio)


def _token_file(given: str | None) -> Path:
    path = given or os.environ.get("MCP_CELERY_AUTH_TOKENS")
    if not path:
        raise ConfigurationError("no token file: pass --file PATH or set MCP_CELERY_AUTH_TOKENS")
    return Path(path)


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["call"], ["tasks"]):
        from mcp_celery.client import _cli as client_cli  # lazily: the client commands need no server code

        sys.exit(client_cli.main(argv))
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        if args.command == "serve":
            serve(
                args.app,
                http=args.http,
                host=args.host,
                port=args.port,
                workers=args.workers,
                allow_unauthenticated=args.allow_unauthenticated,
            )
        elif args.command == "token":
            from mcp_celery.tokens import new_token

            print(new_token(args.principal, _token_file(args.file)))
        else:
            from mcp_celery.demo import run_demo

            sys.exit(run_demo(port=args.port, keep_serving=args.serve))
    except ConfigurationError as exc:
        print(f"mcp-celery: {exc}", file=sys.stderr)
        sys.exit(2)
