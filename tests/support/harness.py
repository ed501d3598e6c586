"""Helpers for the end-to-end tests: the suite's worker and servers, and the raw JSON-RPC clients.

Processes, waits and the raw clients come from the package (`mcp_celery.testing.processes`,
`mcp_celery.testing.jsonrpc`), shared with the demo and the benchmark; this module only knows the
suite's own jobs (`tests.support.sample_jobs`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery.protocol import TASKS_EXTENSION, TERMINAL_STATUSES, client_capabilities, request_meta
from mcp_celery.testing import processes as _processes
from mcp_celery.testing.jsonrpc import RawHttpClient, RawStdioClient
from mcp_celery.testing.processes import free_port, start_redis, wait_for

__all__ = [
    "EXT",
    "ROOT",
    "TERMINAL",
    "HttpClient",
    "REQUIRE_ENV",
    "PersistentRedis",
    "Process",
    "StdioClient",
    "caps",
    "modern_meta",
    "free_port",
    "require_service",
    "http_answers",
    "jobs_env",
    "live_processes",
    "session_redis",
    "start_jobs_worker",
    "start_http_server",
    "start_worker",
    "tcp_unavailable",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]
EXT = TASKS_EXTENSION
TERMINAL = set(TERMINAL_STATUSES)
caps = client_capabilities


def modern_meta(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """The `_meta` envelope of a 2026-07-28 request from the test suite (for hand-built messages)."""
    return request_meta(capabilities, "mcp-celery-tests")


class Process(_processes.Process):
    """A subprocess of the suite, run from the repository root."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        super().__init__(args, env, log, cwd=ROOT)


def start_worker(
    env: Mapping[str, str],
    log: Path,
    *,
    queues: str = "celery",
    name: str = "main",
    app: str = "tests.support.sample_jobs",
    concurrency: int = 4,
) -> Process:
    args = [
        sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork", "-c", str(concurrency),
        "-Q", queues, "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "INFO",
    ]  # fmt: skip
    worker = Process(args, env, log)
    worker.wait_ready(lambda: "ready." in worker.output(), 60, "the worker to start")
    return worker


def session_redis(db: int) -> str:
    """A database of the session's Redis (the one conftest chose; it always holds the results)."""
    return f"{os.environ['TEST_RESULT_BACKEND'].rsplit('/', 1)[0]}/{db}"


def jobs_env(base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """Environment for the real jobs (`-A jobs`) on databases 10 and 11 of the session's Redis, emptied first."""
    broker, backend = session_redis(10), session_redis(11)
    for url in (broker, backend):
        redis.Redis.from_url(url).flushdb()
    return {**base, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": backend, **extra}


def start_jobs_worker(env: Mapping[str, str], log: Path, name: str) -> Process:
    """A prefork worker (2 processes) for the real jobs."""
    return start_worker(env, log, app="jobs", name=f"{name}-{os.getpid()}", concurrency=2)


def start_http_server(
    env: Mapping[str, str], log: Path, *extra: str, app: str = "tests.support.sample_jobs"
) -> tuple[str, Process]:
    """`mcp-celery serve --http` for `app` (the sample jobs) on a free port, once it answers; returns (url, process).

    A port found free can be taken by another process before the server binds it: then another port.
    """
    for attempt in range(3):
        port = free_port()
        args = [sys.executable, "-m", "mcp_celery", "serve", "-A", app, "--http", "--port", str(port)]
        server = Process([*args, *extra], env, log)
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            server.wait_ready(lambda: http_answers(url), 60, "the HTTP server to answer")  # noqa: B023
        except RuntimeError:
            if attempt == 2 or "address already in use" not in server.output():
                raise
            continue
        return url, server
    raise AssertionError("unreachable")


def http_answers(url: str) -> bool:
    """Whether an MCP server answers HTTP at `url` (any answer below 500)."""
    probe = RawHttpClient(url, timeout=1)
    try:
        return probe.send_raw(b"{}", {"Content-Type": "application/json"}).status_code < 500
    except OSError:
        return False
    finally:
        probe.close()


def live_processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, command name, parent pid, process group) of every live process but zombies, from /proc/PID/stat."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if state != "Z":
            yield int(entry.name), comm, int(ppid), int(pgrp)


#: The services besides Redis that must be there (space-separated names, e.g. "rabbitmq fastmcp"):
#: `.ci/run` sets it to the ones CI provides, so a test that needs one of them fails instead of skipping.
REQUIRE_ENV = "MCP_CELERY_TEST_REQUIRE"


def require_service(service: str, unavailable: str | None) -> None:
    """Skip the calling test when `unavailable` says why `service` cannot be used (None: it can);
    fail it instead when REQUIRE_ENV names the service, so CI never passes with the test unrun."""
    if unavailable is None:
        return
    if service in os.environ.get(REQUIRE_ENV, "").split():
        pytest.fail(f"{service} is required ({REQUIRE_ENV}) but {unavailable}", pytrace=False)
    pytest.skip(f"needs {service}: {unavailable}")


def tcp_unavailable(host: str, port: int) -> str | None:
    """Why nothing can be reached at `host:port` within a second, or None when a connection opens."""
    try:
        socket.create_connection((host, port), 1).close()
    except OSError as exc:
        return f"nothing answers on {host}:{port} ({exc})"
    return None


class HttpClient(RawHttpClient):
    """Raw JSON-RPC over Streamable HTTP, 2026-07-28 framing, one request per POST."""

    def __init__(self, url: str, token: str | None = None) -> None:
        super().__init__(url, client_name="mcp-celery-tests")
        if token:  # sent as `Authorization: Bearer TOKEN` on every request
            self.extra_headers["Authorization"] = f"Bearer {token}"


class StdioClient(RawStdioClient):
    """Raw JSON-RPC over a `mcp-celery serve -A tests.support.sample_jobs` subprocess's stdin/stdout."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        args = [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"]
        super().__init__(args, env, log, cwd=ROOT)


class PersistentRedis:
    """A redis-server with append-only persistence that can be stopped and started again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: _processes.Process | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        _, self.proc = start_redis(
            self.folder / f"redis-{self.starts}.log", port=self.port, appendonly=True, data_dir=self.folder
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()  # SIGTERM: Redis flushes its append-only file and exits
            self.proc = None


def redis_commands_during(url: str, touching: list[str], action: Callable[[], object]) -> list[str]:
    """The names of the Redis commands (MONITOR) that mention any of `touching` while `action` runs."""
    seen: list[str] = []
    start, end = f"start-{uuid.uuid4()}", f"end-{uuid.uuid4()}"
    store = redis.Redis.from_url(url)
    watching = threading.Event()

    def watch() -> None:
        with store.monitor() as monitor:
            for command in monitor.listen():
                text = str(command["command"])
                if start in text:
                    watching.set()
                elif end in text:
                    return
                elif watching.is_set() and any(needle in text for needle in touching):
                    seen.append(text.split()[0].upper())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    probe = redis.Redis.from_url(url)
    # MONITOR starts listing commands some time after it is issued: wait until it shows ours.
    wait_for(lambda: probe.echo(start) and watching.wait(0.05), 10, 0, "MONITOR to start")
    probe.close()
    try:
        action()
    finally:
        store.echo(end)
        watcher.join(10)
        store.close()
    return seen
