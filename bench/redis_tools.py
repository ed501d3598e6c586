"""The bench's private Redis and what the bench reads from it: command counts, read events, memory.

The server binary, the readiness check and the process handling come from `mcp_celery.testing.processes`;
this module adds what only the bench needs: the Debian jemalloc build when there is one (what
production Redis looks like; the PATH may hold a shim to another build), DEBUG enabled for the
rehash check after a bulk fill (`settle`), and counters read from INFO.
"""

from __future__ import annotations

import os
import time

import redis

from bench.procs import start
from mcp_celery.store.artifacts import ARTIFACT_FIELD_PREFIX, ArtifactMeta
from mcp_celery.store.schema import Keys
from mcp_celery.testing.processes import Process, free_port, redis_answers, redis_server_binary

DEBIAN_REDIS = "/usr/bin/redis-server"
BENCH_COMMANDS = {"info"}  # the only command the bench itself issues inside a counting window


class BenchRedis:
    """A private redis-server on a spare loopback port, no persistence, stopped by pid."""

    def __init__(self, name: str = "redis") -> None:
        self.name = name  # also the log file's name under bench/.logs
        self.port = free_port()
        self.proc: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = DEBIAN_REDIS if os.path.exists(DEBIAN_REDIS) else redis_server_binary()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--daemonize", "no", "--maxmemory-policy", "noeviction", "--enable-debug-command", "local"]
        self.proc = start(self.name, args)
        try:
            self.proc.wait_ready(lambda: redis_answers(self.url), 20, "redis-server")
        except RuntimeError:
            self.proc.stop()
            raise

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, decode_responses=False)

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()

    def flush(self) -> None:
        self.client().flushall()

    def settle(self, deadline_s: float = 90.0) -> float:
        """Wait until no keyspace dict of any db is still rehashing (after a bulk load). Returns seconds waited."""
        t0 = time.monotonic()
        r = self.client()
        dbs = [int(k[2:]) for k in r.info("keyspace") if k.startswith("db")]
        while time.monotonic() - t0 < deadline_s:
            try:
                busy = any(b"rehashing" in r.execute_command("DEBUG", "HTSTATS", db) for db in dbs)
            except redis.exceptions.ResponseError:  # DEBUG refused: wait a fixed while instead
                time.sleep(5)
                return time.monotonic() - t0
            if not busy:
                return time.monotonic() - t0
            time.sleep(0.2)
        return time.monotonic() - t0

    def version(self) -> str:
        return str(self.client().info("server").get("redis_version"))


def commandstats(r: redis.Redis) -> dict[str, int]:
    """Calls so far per command (INFO commandstats)."""
    out: dict[str, int] = {}
    for k, v in r.info("commandstats").items():
        name = k[len("cmdstat_") :] if k.startswith("cmdstat_") else k
        out[name] = int(v["calls"])
    return out


def cmd_delta(before: dict[str, int], after: dict[str, int], exclude: set[str] = BENCH_COMMANDS) -> dict[str, int]:
    """Calls per command between two `commandstats`, without the bench's own bookkeeping."""
    d = {}
    for k, v in after.items():
        if k.split("|")[0] in exclude:
            continue
        diff = v - before.get(k, 0)
        if diff:
            d[k] = diff
    return d


def top_cmds(d: dict[str, int], n: float, k: int = 12) -> str:
    """The `k` most frequent commands of a delta, per unit of `n` (e.g. per task)."""
    return ", ".join(f"{c} {v / n:.2f}" for c, v in sorted(d.items(), key=lambda kv: -kv[1])[:k])


def connections_received(r: redis.Redis) -> int:
    return int(r.info("stats").get("total_connections_received", 0))


def reads_processed(r: redis.Redis) -> int:
    """Read events so far: one per request batch a client sent (≈ round trips)."""
    return int(r.info("stats").get("total_reads_processed", 0))


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def keys_stored(r: redis.Redis) -> int:
    """Keys in every db of the server."""
    return sum(v.get("keys", 0) for v in r.info("keyspace").values())


def idle_rates(r: redis.Redis, seconds: float) -> tuple[float, float]:
    """Commands/s and read events/s on Redis with nothing but background polling (worker, server)."""
    c0, rd0 = commandstats(r), reads_processed(r)
    time.sleep(seconds)
    c1, rd1 = commandstats(r), reads_processed(r)
    return sum(cmd_delta(c0, c1).values()) / seconds, (rd1 - rd0 - 2) / seconds


def wait_quiet(r: redis.Redis, idle_cps: float, deadline_s: float, min_wait: float = 0.2) -> float:
    """Wait until Redis command traffic falls back to the idle rate (the worker has drained the queue)."""
    time.sleep(min_wait)
    end = time.monotonic() + deadline_s
    prev = sum(cmd_delta({}, commandstats(r)).values())
    quiet = 0
    t0 = time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.1)
        cur = sum(cmd_delta({}, commandstats(r)).values())
        if cur - prev <= idle_cps * 0.1 + 3:
            quiet += 1
            if quiet >= 3:
                return time.monotonic() - t0
        else:
            quiet = 0
        prev = cur
    raise TimeoutError("Redis did not go quiet (queue not drained)")


def artifact_keys(client: redis.Redis, task_id: str, name: str) -> list[str]:
    """The keys that hold the bytes of the task's artifact `name` in the store's Redis, as its record lists them."""
    entry = client.hget(Keys().task(task_id), ARTIFACT_FIELD_PREFIX + name)
    if not isinstance(entry, bytes):
        raise RuntimeError(f"task {task_id} has no artifact {name!r}")
    return ArtifactMeta.from_json(name, entry.decode()).redis_keys(Keys(), task_id)
