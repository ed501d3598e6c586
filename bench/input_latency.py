"""Input round-trip latency: from sending `tasks/update` to the waiting job carrying on.

    python -m bench.input_latency [--runs 50] [--warmup 3] [--redis redis://HOST:PORT]

Starts a prefork worker (-c 4) and `mcp-celery serve --http` for `bench.bench_jobs` over Redis
databases 14 (broker) and 15 (results and records), flushed first: of a private redis-server it
starts itself, or of the server `--redis` names. Then, `--runs` times:

1. `tools/call ask_one` (a task), poll `tasks/get` until it is `input_required`, and poll
   Celery's result meta until the job has parked itself in the INPUT_REQUIRED state;
2. t0, send `tasks/update` with the answer (t_ack when its HTTP response is back);
3. meanwhile (the update is sent from a second thread), GET the Celery meta key in a tight
   loop (no sleep) until its status is no longer INPUT_REQUIRED: the job woke from its BLPOP on
   the bell, read the answer and wrote STARTED (or already SUCCESS). t1 is the end of the first
   GET that sees it.

Reported: t1 - t0 ("job continues", resolution one GET, ~0.1-0.3 ms) and t_ack - t0 (the
tasks/update round trip); the job often carries on before the client has its ack.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from bench.procs import LOGS, ROOT, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from bench.rpc import TASKS_EXT, SyncClient
from mcp_celery.testing.processes import wait_for

BROKER_DB, BACKEND_DB = 14, 15
TERMINAL = ("completed", "failed", "cancelled")


def _percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, int(-(-pct * len(ordered) // 100)))
    return ordered[rank - 1]


def _summary(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{name:<28} p50 {_percentile(ms, 50):7.2f} ms   p95 {_percentile(ms, 95):7.2f} ms   "
        f"min {min(ms):7.2f} ms   max {max(ms):7.2f} ms"
    )


@dataclass
class Probe:
    """One server, its jobs' result backend, and the rounds of the measurement."""

    client: SyncClient
    results: redis.Redis  # the result backend db: the Celery meta keys live there
    backend: Any  # the app's Celery backend: meta key names and their decoding

    def meta_status(self, key: Any) -> str | None:
        raw = self.results.get(key)
        return None if raw is None else str(self.backend.decode(raw).get("status"))

    def status_in(self, task_id: str, statuses: tuple[str, ...]) -> dict[str, Any] | None:
        """The task's tasks/get answer if its status is one of `statuses`, else None."""
        task = self.client.get(task_id)
        return task if task["status"] in statuses else None

    def park_a_job(self) -> tuple[str, Any, str]:
        """Start ask_one and wait until its job waits for the answer; returns (task id, meta key, input key)."""
        task_id = self.client.start("ask_one", {})
        meta_key = self.backend.get_key_for_task(task_id)
        task = wait_for(lambda: self.status_in(task_id, ("input_required",)), 30, 0.005, "input_required")
        (key,) = task["inputRequests"]
        wait_for(lambda: self.meta_status(meta_key) == "INPUT_REQUIRED", 30, 0.002, "the job to park")
        return task_id, meta_key, key

    def one_round(self) -> tuple[float, float, bool]:
        """(job continues - t0, ack - t0, whether the job continued before the ack)."""
        task_id, meta_key, key = self.park_a_job()
        answer = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
        sent: dict[str, float] = {}

        def send() -> None:
            sent["t0"] = time.perf_counter()
            self.client.result("tasks/update", answer, task_id)
            sent["ack"] = time.perf_counter()

        sender = threading.Thread(target=send)
        sender.start()  # the GET loop below runs while the update is in flight
        deadline = time.perf_counter() + 30
        while True:
            status = self.meta_status(meta_key)
            t1 = time.perf_counter()
            if status != "INPUT_REQUIRED":
                break
            if t1 > deadline:
                raise RuntimeError(f"task {task_id}: the job did not continue within 30 s")
        sender.join(30)
        assert "ack" in sent, "tasks/update got no answer"
        done = wait_for(lambda: self.status_in(task_id, TERMINAL), 30, 0.05, "the task to end")
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "published", done
        return t1 - sent["t0"], sent["ack"] - sent["t0"], t1 < sent["ack"]


@contextmanager
def redis_base(url: str | None) -> Iterator[str]:
    """The Redis server to use: `url`, or a private one started (and stopped) here."""
    if url:
        yield url.rstrip("/")
        return
    private = BenchRedis("redis-input-latency")
    private.start()
    try:
        yield private.url
    finally:
        private.stop()


@contextmanager
def probe_on(base: str) -> Iterator[Probe]:
    """Flush DBs 14/15 of `base`, start a worker and the HTTP server over them, stop both at the end."""
    broker, backend = f"{base}/{BROKER_DB}", f"{base}/{BACKEND_DB}"
    os.environ["BENCH_BROKER_URL"], os.environ["BENCH_BACKEND_URL"] = broker, backend  # before bench_jobs loads
    from bench import bench_jobs

    results = redis.Redis.from_url(backend)
    redis.Redis.from_url(broker).flushdb()
    results.flushdb()
    env = {"BENCH_BROKER_URL": broker, "BENCH_BACKEND_URL": backend}
    with serving(bench_jobs.app, base, "input-latency", results, env) as probe:
        yield probe


@contextmanager
def serving(app: Any, base: str, name: str, results: redis.Redis, env: dict[str, str] | None = None) -> Iterator[Probe]:
    """A prefork worker (-c 4) and `mcp-celery serve --http` for bench.bench_jobs over `base`, and a Probe of
    them whose `results` is the database of the jobs' Celery results; both are stopped at the end."""
    worker = start_worker(base, f"worker-{name}", concurrency=4, env=env)
    server = None
    try:
        server, url = start_ours_server(base, f"server-{name}", env=env)
        wait_worker(app, worker)
        client = SyncClient(url, {"extensions": {TASKS_EXT: {}}, "elicitation": {}})
        try:
            yield Probe(client, results, app.backend)
        finally:
            client.close()
    finally:
        if server is not None:
            server.stop()
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.input_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--redis", default=None, help="use this Redis server (DBs 14 and 15) instead of a private one")
    args = parser.parse_args(argv)

    cont: list[float] = []
    acks: list[float] = []
    early = 0
    with redis_base(args.redis) as base, probe_on(base) as probe:
        for _ in range(args.warmup):
            probe.one_round()
        for _ in range(args.runs):
            c, a, before = probe.one_round()
            cont.append(c)
            acks.append(a)
            early += before

    print(f"input round-trip latency, {args.runs} runs of ask_one (after {args.warmup} warm-up runs)")
    print(f"  worker: prefork -c 4, server: mcp-celery serve --http (stateless JSON), Redis {base} DBs 14/15")
    print("  method: t0 = tasks/update sent (from a second thread); job continuing = first GET, in a tight loop")
    print("          running meanwhile, that finds the Celery meta key's status no longer INPUT_REQUIRED")
    print("          (the job woke from BLPOP on its bell and wrote STARTED)")
    print("  " + _summary("tasks/update -> job continues", cont))
    print("  " + _summary("tasks/update HTTP round trip", acks))
    print(f"  the job carried on before the client had the ack in {early}/{args.runs} runs")
    print(f"  logs: {LOGS.relative_to(ROOT)}/*input-latency.log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
