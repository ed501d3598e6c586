"""`mcp-celery serve` (MCP over stdio or Streamable HTTP), `top` and `demo`. Wiring only.

Each subcommand imports its tier only when it runs, so `mcp-celery --help` loads neither
Celery nor the MCP server.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mcp_celery import logs
from mcp_celery.errors import ConfigurationError, McpCeleryError

if TYPE_CHECKING:
    from celery import Celery

    from mcp_celery.settings import Settings

__all__ = ["CLIENT_COMMANDS", "main", "parser", "parser_for"]

logger = logging.getLogger(__name__)


def serve(
    app_spec: str,
    settings: Settings,
    *,
    workdir: str | None = None,
    http: bool,
    host: str,
    port: int,
    workers: int,
    allow_unauthenticated: bool = False,
) -> None:
    from mcp_celery.core.binding import AppBinding
    from mcp_celery.core.celery_app import load_app, use_workdir
    from mcp_celery.core.tools import registry
    from mcp_celery.redact import redact
    from mcp_celery.server.app import check_tool_names
    from mcp_celery.store.artifact_files import check_store
    from mcp_celery.store.probe import probe

    if workdir is not None:
        use_workdir(workdir)
    # Fail early, with a clear message, before any worker process starts: the tools, the Redis URL,
    # Redis itself (reachable, TLS, credentials, version), and where artifacts go, each a line of its own.
    if http:
        _check_http_auth(settings, host, port, allow_unauthenticated)
    app = load_app(app_spec)
    check_tool_names(app, settings)
    binding = AppBinding.create(app, settings)
    probe(binding.redis)
    check_store(settings.artifacts, binding.keys.prefix)
    tools = registry(app)
    if settings.approval_policy:
        _check_approval_policy(app, settings, http=http)
    for spec in tools.values():
        if not spec.described:
            logger.warning(
                "tool %r has no docstring: the model reads a description made from its name and parameters "
                "(give %s a docstring, or pass description=...)",
                spec.name,
                spec.celery_task.name,
            )
    # Every check passed. The store every worker must share: a worker with another refuses the jobs, naming both.
    logs.announce(f"task store {binding.described}")
    if http:
        if settings.metrics_port is not None:  # server processes of --workers N read it from the environment
            os.environ["MCP_CELERY_METRICS_PORT"] = str(settings.metrics_port)
        about = f"app {app_spec}, {len(tools)} tools, Redis {redact(binding.redis.url)}"
        _serve_http(app_spec, host, port, workers, settings, about)
    else:
        _serve_stdio(app, settings)


def _serve_http(
    app_spec: str,
    host: str,
    port: int,
    workers: int,
    settings: Settings,
    about: str = "",
) -> None:
    import uvicorn

    from mcp_celery.server import http

    os.environ[http.APP_ENV], os.environ[http.HOST_ENV], os.environ[http.PORT_ENV] = app_spec, host, str(port)
    _check_port(host, port)
    from mcp_celery.server.ops.operations import metrics_access

    processes = f"{workers} server process{'es' if workers > 1 else ''}"
    guard = metrics_access(settings)
    _say_when_listening(host, port, f"http://{_url_host(host)}:{port}/mcp ({about}; {processes}; {guard})")
    with _metrics_directory(workers):
        # Task state lives in Redis only, so any worker process can answer for any task.
        factory = "mcp_celery.server.http:http_app_from_env"
        target = factory if workers > 1 else http.http_app(app_spec, host, port, settings)
        if settings.metrics_port is not None:
            _serve_metrics_port(http.metrics_app(app_spec, settings, host, port), host, settings.metrics_port)
        options = {**logs.uvicorn_options(), **_proxy_options(settings)}  # JSON lines from uvicorn's workers too
        uvicorn.run(target, factory=workers > 1, host=host, port=port, workers=workers, log_level="warning", **options)


def _proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's keywords for X-Forwarded-For and -Proto: believed from MCP_CELERY_TRUSTED_PROXIES only
    (uvicorn alone would believe any process on 127.0.0.1, which could then pose as any client)."""
    trusted = settings.trusted_proxies
    return {"proxy_headers": True, "forwarded_allow_ips": trusted} if trusted else {"proxy_headers": False}


def _check_http_auth(settings: Settings, host: str, port: int, allow_unauthenticated: bool) -> None:
    """Raises ConfigurationError, in one line, when the server would be open to other machines without
    authentication, or its token file, JWT or OpenID Connect settings cannot work (MCP_CELERY_JWT_JWKS
    without MCP_CELERY_JWT_ISSUER, say): here, before the jobs are imported (their warnings) and before any
    uvicorn worker process starts."""
    from mcp_celery.server.approvals.oidc import oidc_config
    from mcp_celery.server.edge import auth

    auth.check_exposure(settings, host, allow_unauthenticated=allow_unauthenticated)
    auth.build_verifier(settings, auth.public_url(settings, host, port))
    oidc_config(settings, auth.public_url(settings, host, port))  # the approval page's OpenID Connect sign-in


def _check_approval_policy(app: Celery, settings: Settings, *, http: bool) -> None:
    """Raises ConfigurationError, naming the line, for a policy file that cannot be read or is not a policy,
    and without HTTP (no approval page of this server) when the page's link cannot be made; warns of a
    table that matches no tool (a typo would hold nothing)."""
    from mcp_celery.core.tools import registry
    from mcp_celery.server.engine.gate import PolicyGate

    gate = PolicyGate(settings, registry(app), app)
    for pattern in gate.file.unmatched() if gate.file is not None else []:
        logger.warning(
            "approval policy %s: [tools.%r] matches none of this app's tools", settings.approval_policy, pattern
        )
    if not http and not settings.public_url:
        raise ConfigurationError(
            "MCP_CELERY_APPROVAL_POLICY needs MCP_CELERY_PUBLIC_URL over stdio: the URL of the server whose "
            "/approvals page the approvers use (e.g. https://jobs.example/mcp)"
        )


def _check_port(host: str, port: int) -> None:
    """Raises ConfigurationError when `host:port` cannot be listened on (taken, say), in one line."""
    import socket

    try:
        socket.create_server((host, port)).close()  # SO_REUSEADDR, as uvicorn binds
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from exc


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _say_when_listening(host: str, port: int, what: str) -> None:
    """Print "listening on WHAT" on stderr once the port takes connections (uvicorn itself says nothing
    at log level warning), from a thread: uvicorn.run keeps this one."""
    import socket
    import threading
    import time

    target = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)

    def wait() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection((target, port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            logs.announce(f"listening on {what}")
            return

    threading.Thread(target=wait, name="mcp-celery-listening", daemon=True).start()


@contextlib.contextmanager
def _metrics_directory(workers: int) -> Iterator[None]:
    """With several server processes, a fresh directory for prometheus_client's multiprocess mode, removed
    at the end: the processes (started after this) write their values there, /metrics sums them. One set
    by the operator (PROMETHEUS_MULTIPROC_DIR) is used as it is, and left in place."""
    import uuid

    from mcp_celery.server.ops.metrics import MULTIPROC_ENV, REPLICA_ENV

    if workers > 1:
        os.environ.setdefault(REPLICA_ENV, uuid.uuid4().hex)
    if workers <= 1 or os.environ.get(MULTIPROC_ENV):
        yield
        return
    folder = tempfile.mkdtemp(prefix="mcp-celery-metrics-")
    os.environ[MULTIPROC_ENV] = folder
    try:
        yield
    finally:
        del os.environ[MULTIPROC_ENV]
        shutil.rmtree(folder, ignore_errors=True)


def _serve_metrics_port(app: Any, host: str, port: int) -> None:
    """Serve `app` (the probes and /metrics) on `port`, on a thread of this process: the one that
    starts the server processes, and outlives them.

    Raises:
        ConfigurationError: the port cannot be served (taken, say), said before the MCP port opens.
    """
    import threading
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, name="mcp-celery-metrics", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise ConfigurationError(f"cannot serve --metrics-port {port} on {host} (see the error above)")


def _serve_stdio(app: Celery, settings: Settings) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    from mcp_celery.server import create_server
    from mcp_celery.server.edge import limits

    server = create_server(app, settings)

    async def run_stdio() -> None:
        async with stdio_server() as (read, write):
            answering = limits.AnswerUnreadable(read, write)  # -32700/-32600 for unreadable lines
            await server.run(answering, write, server.create_initialization_options())

    anyio.run(run_stdio)


def top(app_spec: str, settings: Settings, *, interval_s: float, once: bool, workdir: str | None = None) -> None:
    import asyncio

    from redis.exceptions import RedisError

    from mcp_celery.cli.top import reader_for, run_top
    from mcp_celery.core.celery_app import load_app, use_workdir
    from mcp_celery.redact import redact

    if workdir is not None:
        use_workdir(workdir)
    reader = reader_for(load_app(app_spec), settings)

    async def run() -> None:
        try:
            await run_top(reader, interval_s=interval_s, once=once)
        finally:
            await reader.aclose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:  # Ctrl-C: the screen is restored already; leave quietly
        pass
    except (RedisError, OSError) as exc:
        raise ConfigurationError(f"top: cannot read Redis: {redact(str(exc))}") from exc


def _token(args: argparse.Namespace, settings: Settings) -> None:
    """`token new` prints the new token (only there, once); `token revoke` says how many lines went."""
    from mcp_celery.server.edge.tokens import new_token, revoke_tokens

    path = _token_file(args.file, settings)
    if args.token_command == "new":
        print(new_token(args.principal, path))
    else:
        removed = revoke_tokens(args.principal, path)
        print(f"revoked {removed} token{'s' if removed > 1 else ''} of {args.principal} in {path}")


def _token_file(given: str | None, settings: Settings) -> Path:
    path = given or settings.auth_tokens
    if not path:
        raise ConfigurationError("no token file: pass --file PATH or set MCP_CELERY_AUTH_TOKENS")
    return Path(path)


def parser() -> argparse.ArgumentParser:
    """The parser of the server-side commands: `serve`, `token`, `demo` (`call` and `tasks`: `parser_for`)."""
    root = argparse.ArgumentParser(
        prog="mcp-celery",
        description="Celery jobs as MCP tools (SEP-2663 tasks).",
        epilog="client commands (any SEP-2663 server): mcp-celery call --help, mcp-celery tasks --help",
    )
    root.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    root.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,  # then the process's Settings (MCP_CELERY_LOG_FORMAT, default text)
        help="json: one JSON object per line, with task id, tool and status (default: $MCP_CELERY_LOG_FORMAT or text)",
    )
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the app's tools over MCP (stdio by default)")
    _app_options(run)
    _serve_options(run)
    token = commands.add_parser("token", help="manage static bearer tokens (MCP_CELERY_AUTH_TOKENS)")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    new = token_commands.add_parser("new", help="print a new token for PRINCIPAL once; append its digest to the file")
    new.add_argument("principal", help="who the token speaks for: tasks belong to this name")
    new.add_argument("--file", help="token file (default: $MCP_CELERY_AUTH_TOKENS)")
    revoke = token_commands.add_parser(
        "revoke", help="remove every token of PRINCIPAL from the file; their approval-page sessions end with them"
    )
    revoke.add_argument("principal", help="whose tokens to remove")
    revoke.add_argument("--file", help="token file (default: $MCP_CELERY_AUTH_TOKENS)")
    view = commands.add_parser("top", help="a live view of the deployment, read from Redis (no server needed)")
    _app_options(view)
    view.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    view.add_argument("--once", action="store_true", help="print one frame and exit")
    demo = commands.add_parser(
        "demo", help="start a private Redis, a worker and the server, and walk through the demo jobs"
    )
    demo.add_argument("--port", type=int, default=8000, help="HTTP port of the demo server (default 8000)")
    demo.add_argument("--serve", action="store_true", help="keep serving after the walkthrough, until Ctrl-C")
    demo.add_argument(
        "--oidc",
        action="store_true",
        help="also start a test OpenID Connect provider on localhost: bob signs in there to approve (step 6)",
    )
    for name, text in CLIENT_COMMANDS.items():
        # Listed here; parsed by the client's own parser (`parser_for`), which this one does not import.
        client = commands.add_parser(name, help=text, add_help=False)
        client.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return root


def _serve_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--http", action="store_true", help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio"
    )
    command.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on with --http (default 127.0.0.1; any other needs authentication, or "
        "--allow-unauthenticated, and MCP_CELERY_ALLOWED_HOSTS for the name clients use)",
    )
    command.add_argument("--port", type=int, default=8000, help="port to listen on with --http (default 8000)")
    command.add_argument("--workers", type=int, default=1, help="HTTP server processes (default 1)")
    command.add_argument(
        "--metrics-port",
        type=int,
        help="with --http, serve /metrics (and /healthz, /readyz) on this port instead of the MCP port",
    )
    command.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --host without MCP_CELERY_AUTH_TOKENS or MCP_CELERY_JWT_JWKS",
    )


def _app_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-A", "--app", required=True, help="module or module:app holding the Celery app, as celery -A; or its file, "
        "proj.py or /path/to/proj.py[:app], whose directory is searched first"
    )  # fmt: skip
    command.add_argument(
        "--workdir",
        metavar="DIR",
        help="search DIR first for the app's module (as celery --workdir), for a host that starts the server "
        "in another directory",
    )


#: The client's commands (`mcp_celery.client._cli`), and what `mcp-celery --help` says of them.
CLIENT_COMMANDS = {
    "call": "call a tool of any SEP-2663 server as a task: progress, questions, Ctrl-C to cancel",
    "tasks": "the tasks in the local journal: list, get, wait, cancel",
}


def parser_for(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser that reads `mcp-celery ARGV...`, and the arguments it parses.

    `call` and `tasks` belong to the client (`mcp_celery.client._cli`), loaded only for them; what
    follows `--` on their command line is the stdio server's command, not parsed.
    """
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        from mcp_celery.client import _cli as client_cli  # lazily: the client commands need no server code

        return client_cli.parser(), client_cli.split_argv(argv)[0]
    return parser(), list(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        from mcp_celery.client import _cli as client_cli

        sys.exit(client_cli.main(argv))
    root = parser()
    args, unknown = root.parse_known_args(argv)
    try:
        settings = _process_settings(args)
    except ConfigurationError as exc:
        _refuse(exc)
    logs.configure(args.log_level, args.log_format or settings.log_format)
    if args.command in CLIENT_COMMANDS:  # after the root's options (`mcp-celery --log-level INFO call ...`)
        from mcp_celery.client import _cli as client_cli

        sys.exit(client_cli.main(argv[argv.index(args.command) :]))  # its logging set up above already
    if unknown:
        root.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "serve":
            serve(
                args.app,
                settings,
                workdir=args.workdir,
                http=args.http,
                host=args.host,
                port=args.port,
                workers=args.workers,
                allow_unauthenticated=args.allow_unauthenticated,
            )
        elif args.command == "top":
            top(args.app, settings, interval_s=args.interval, once=args.once, workdir=args.workdir)
        elif args.command == "token":
            _token(args, settings)
        else:
            from mcp_celery.cli.demo import run_demo

            sys.exit(run_demo(port=args.port, keep_serving=args.serve, oidc=args.oidc))
    except McpCeleryError as exc:  # a configuration or tool definition that cannot work: one line says why
        _refuse(exc)


def _process_settings(args: argparse.Namespace) -> Settings:
    """This process's one Settings: the environment, and (`serve --http`) --metrics-port over it."""
    from mcp_celery.settings import Settings

    if args.command == "serve" and args.http and args.metrics_port is not None:
        return Settings(metrics_port=args.metrics_port)
    return Settings()


def _refuse(exc: McpCeleryError) -> NoReturn:
    print(f"mcp-celery: {exc}", file=sys.stderr)
    sys.exit(2)
