"""The chaos test's processes: an append-only Redis, two prefork workers and two HTTP servers.

Nothing here waits on a process it restarts (the driver keeps polling meanwhile): a restarted
worker or server is only spawned, and counts as up once it answers.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import redis

from tests.support.harness import PersistentRedis, Process, free_port, http_answers

APP = "tests.support.chaos.jobs"

#: Short periods keep the run quick: a job silent for 3 s is lost; an unstarted task's message is
#: looked for every 3 s; a cancel has 1 s; SIGTERM gives 2 s.
SETTINGS = {
    "MCP_CELERY_WORKER_LOST_TIMEOUT_S": "3",
    "MCP_CELERY_QUEUE_CHECK_S": "3",
    "MCP_CELERY_CANCEL_GRACE_S": "1",
    "MCP_CELERY_SHUTDOWN_GRACE_S": "2",
    "MCP_CELERY_SYNC_TIMEOUT_S": "5",
}


class Cluster:
    """Redis, workers `w1`, `w2` and servers 0 and 1 (fixed ports, so clients keep their URLs)."""

    def __init__(self, folder: Path, concurrency: int = 6, workers: int = 2, servers: int = 2) -> None:
        self.folder = folder
        self.concurrency = concurrency
        self.redis = PersistentRedis(folder / "redis")
        base = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
        self.env = {**base, **SETTINGS, "CHAOS_REDIS": self.redis.url, "PYTHONUNBUFFERED": "1"}
        self.workers: dict[str, Process | None] = {f"w{i + 1}": None for i in range(workers)}
        self.ports = [free_port() for _ in range(servers)]
        self.servers: list[Process | None] = [None] * servers
        self._starts: dict[str, int] = {}
        #: Every process started, so that close() stops each one whatever happened to it.
        self._started: list[Process] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/mcp" for port in self.ports]

    def runs_db(self) -> redis.Redis:
        return redis.Redis.from_url(f"{self.redis.url}/3", socket_timeout=5, socket_connect_timeout=2)

    def queued(self) -> int | None:
        """Messages waiting in the broker's queue and in kombu's unacked set (None: Redis unreachable)."""
        broker = redis.Redis.from_url(f"{self.redis.url}/0", socket_timeout=5, socket_connect_timeout=2)
        try:
            return int(broker.llen("celery")) + int(broker.hlen("unacked"))
        except (redis.RedisError, OSError):
            return None
        finally:
            broker.close()

    def start(self) -> None:
        """Start everything and wait until each worker is ready and each server answers."""
        self.redis.start()
        for name in self.workers:
            self.start_worker(name)
        for index in range(len(self.servers)):
            self.start_server(index)
        for proc in self.workers.values():
            assert proc is not None
            proc.wait_ready(lambda p=proc: "ready." in p.output(), 90, "a chaos worker to start")
        for proc, url in zip(self.servers, self.urls, strict=True):
            assert proc is not None
            proc.wait_ready(lambda u=url: http_answers(u), 90, "a chaos server to answer")

    @property
    def starts(self) -> dict[str, int]:
        """How many times each process was started, Redis included."""
        return {**self._starts, "redis": self.redis.starts}

    def _log(self, name: str) -> Path:
        self._starts[name] = self._starts.get(name, 0) + 1
        return self.folder / f"{name}-{self._starts[name]}.log"

    def start_worker(self, name: str) -> None:
        args = [
            sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork", "-c", str(self.concurrency),
            "-n", f"{name}-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "INFO",
        ]  # fmt: skip
        assert self.worker_pid(name) is None, f"worker {name} is already running"
        self.workers[name] = proc = Process(args, self.env, self._log(name))
        self._started.append(proc)

    def worker_pid(self, name: str) -> int | None:
        proc = self.workers[name]
        return proc.pid if proc is not None and proc.alive() else None

    def kill_worker(self, name: str) -> int:
        """SIGKILL the worker's whole process group (parent and pool at once); returns the parent's pid."""
        proc = self.workers[name]
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=30)
        self.workers[name] = None
        return proc.pid

    def terminate_worker(self, name: str) -> int:
        """SIGTERM the worker's parent only, as a process manager does (a warm shutdown)."""
        proc = self.workers[name]
        assert proc is not None
        os.kill(proc.pid, signal.SIGTERM)
        return proc.pid

    def reap_worker(self, name: str) -> bool:
        """Whether a terminated worker has exited (then it is forgotten, its orphans killed)."""
        proc = self.workers[name]
        if proc is None or proc.alive():
            return proc is None
        proc.stop()
        self.workers[name] = None
        return True

    def log_tail(self, name: str, lines: int = 40) -> str:
        proc = self.workers[name]
        return "" if proc is None else proc.tail(lines)

    def start_server(self, index: int) -> None:
        args = [sys.executable, "-m", "mcp_celery", "serve", "-A", APP, "--http", "--port", str(self.ports[index])]
        self.servers[index] = proc = Process(args, self.env, self._log(f"server{index}"))
        self._started.append(proc)

    def kill_server(self, index: int) -> None:
        proc = self.servers[index]
        assert proc is not None
        proc.kill(signal.SIGKILL)
        self.servers[index] = None

    def restart_redis(self) -> None:
        """Stop Redis (SIGTERM: it writes its append-only file) and start it again on the same port and folder."""
        self.redis.stop()
        self.redis.start()

    def close(self) -> None:
        for proc in self._started:
            proc.stop()  # also kills what is left of a process group whose parent is gone
        self.redis.stop()
