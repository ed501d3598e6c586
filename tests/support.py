"""Helpers for the end-to-end tests: processes started and stopped by pid, raw JSON-RPC clients."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from mcp_celery.demo import stop_group

ROOT = Path(__file__).resolve().parent.parent
EXT = "io.modelcontextprotocol/tasks"
TERMINAL = {"completed", "failed", "cancelled"}
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], T | None], timeout: float = 15.0, interval: float = 0.02, what: str = "") -> T:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(interval)


def caps(declare: bool = True, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    if declare:
        out["extensions"] = {EXT: {}}
    return out


def modern_meta(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": dict(capabilities),
        "io.modelcontextprotocol/clientInfo": {"name": "mcp-celery-tests", "version": "0"},
    }


class Process:
    """A subprocess in its own process group, stopped by pid."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=dict(env), stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        self._log_file.close()

    def stop(self) -> None:
        stop_group(self.proc)
        if not self._log_file.closed:
            self._log_file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_worker(env: Mapping[str, str], log: Path, *, queues: str = "celery", name: str = "main") -> Process:
    args = [
        sys.executable, "-m", "celery", "-A", "tests.sample_jobs", "worker", "-P", "prefork", "-c", "4",
        "-Q", queues, "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "INFO",
    ]  # fmt: skip
    worker = Process(args, env, log)
    wait_for(lambda: "ready." in worker.output() or not worker.alive(), 60, 0.1, "the worker to start")
    assert worker.alive(), worker.output()
    return worker


def start_http_server(env: Mapping[str, str], log: Path, *extra: str) -> tuple[str, Process]:
    """`mcp-celery serve --http` for the sample jobs on a free port, once it answers; returns (url, process)."""
    port = free_port()
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.sample_jobs", "--http", "--port", str(port)]
    server = Process([*args, *extra], env, log)
    url = f"http://127.0.0.1:{port}/mcp"

    def ready() -> bool:
        assert server.alive(), server.output()
        try:
            return httpx.post(url, json={}, timeout=1).status_code < 500
        except httpx.TransportError:
            return False

    wait_for(ready, 60, 0.1, "the HTTP server to answer")
    return url, server


class HttpClient:
    """Raw JSON-RPC over Streamable HTTP, 2026-07-28 framing, one request per POST."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        # token: sent as `Authorization: Bearer TOKEN` on every request.
        self.http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"} if token else None)
        self._id = 0

    def post(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        capabilities: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> httpx.Response:
        self._id += 1
        body_params = {**(params or {}), "_meta": modern_meta(caps() if capabilities is None else capabilities)}
        hdrs = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
        }
        # name="" sends no Mcp-Name header at all.
        route = name if name is not None else (params or {}).get("taskId") or (params or {}).get("name")
        if route:
            hdrs["Mcp-Name"] = str(route)
        hdrs.update(headers or {})
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": body_params}
        return self.http.post(self.url, json=body, headers=hdrs)

    def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        response = self.post(method, params, **kw)
        return dict(response.json())

    def result(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        reply = self.call(method, params, **kw)
        assert "result" in reply, reply
        return dict(reply["result"])

    def start(self, tool: str, arguments: Mapping[str, Any] | None = None, **capabilities: Any) -> str:
        result = self.result(
            "tools/call", {"name": tool, "arguments": dict(arguments or {})}, capabilities=caps(**capabilities)
        )
        assert result["resultType"] == "task", result
        return str(result["taskId"])

    def get(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return self.result("tasks/get", {"taskId": task_id}, **kw)

    def wait(self, task_id: str, statuses: Iterable[str] = TERMINAL, timeout: float = 15.0) -> dict[str, Any]:
        wanted = set(statuses)
        return wait_for(
            lambda: (t := self.get(task_id))["status"] in wanted and t, timeout, 0.05, f"{task_id} in {wanted}"
        )

    def close(self) -> None:
        self.http.close()


class StdioClient:
    """Raw JSON-RPC over a `mcp-celery serve` subprocess's stdin/stdout (newline-delimited)."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.sample_jobs"],
            cwd=ROOT, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True,
        )  # fmt: skip
        self._id = 0

    def send(self, message: Mapping[str, Any]) -> None:
        self.send_raw(json.dumps(message))

    def send_raw(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: Mapping[str, Any] | None = None, *, modern: bool = True,
                capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        self._id += 1
        body = dict(params or {})
        if modern:
            body["_meta"] = modern_meta(caps() if capabilities is None else capabilities)
        self.send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": body})
        return self._read_reply(self._id)

    def _read_reply(self, request_id: int) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, "the stdio server closed its output"
            message = json.loads(line)
            if message.get("id") == request_id:
                return dict(message)

    def close(self) -> None:
        stop_group(self.proc)
        self._log.close()
