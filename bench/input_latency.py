"""Input round-trip latency: from sending `tasks/update` to the waiting job carrying on.

    python -m bench.input_latency [--runs 50] [--redis redis://127.0.0.1:6379]

Starts its own prefork worker and `mcp-celery serve --http` (as the test fixtures do, with the
helpers of tests/support.py) on Redis databases 14 (broker) and 15 (results and records),
flushed first, so it does not disturb the test suite on 12/13. Then, `--runs` times:

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
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BROKER_DB, BACKEND_DB = 14, 15


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.input_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server (DBs 14 and 15 are used)")
    args = parser.parse_args(argv)

    base = args.redis.rstrip("/")
    # Before tests.sample_jobs is imported: it reads these when it builds its Celery app.
    os.environ["TEST_BROKER_URL"] = f"{base}/{BROKER_DB}"
    os.environ["TEST_RESULT_BACKEND"] = f"{base}/{BACKEND_DB}"

    import redis

    from tests import sample_jobs
    from tests.support import ROOT, HttpClient, Process, caps, free_port, start_worker, wait_for

    results = redis.Redis.from_url(os.environ["TEST_RESULT_BACKEND"])
    redis.Redis.from_url(os.environ["TEST_BROKER_URL"]).flushdb()
    results.flushdb()

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = Path(tempfile.mkdtemp(prefix="input-latency-"))
    worker = start_worker(env, logs / "worker.log", name="input-latency")
    port = free_port()
    server = Process(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.sample_jobs", "--http", "--port", str(port)],
        env,
        logs / "http-server.log",
    )
    client = HttpClient(f"http://127.0.0.1:{port}/mcp")
    backend: Any = sample_jobs.app.backend
    elicit = caps(elicitation={})

    def server_up() -> bool:
        assert server.alive(), server.output()
        try:
            return client.http.post(client.url, json={}, timeout=1).status_code < 500
        except Exception:  # noqa: BLE001
            return False

    def meta_status(key: Any) -> str | None:
        raw = results.get(key)
        return None if raw is None else str(backend.decode(raw).get("status"))

    def one_round() -> tuple[float, float, bool]:
        task_id = client.start("ask_one", **elicit)
        meta_key = backend.get_key_for_task(task_id)
        task = wait_for(
            lambda: (t := client.get(task_id))["status"] == "input_required" and t, 30, 0.005, "input_required"
        )
        (key,) = task["inputRequests"]
        wait_for(lambda: meta_status(meta_key) == "INPUT_REQUIRED", 30, 0.002, "the job to park")
        answer = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
        sent: dict[str, float] = {}

        def send() -> None:
            sent["t0"] = time.perf_counter()
            client.result("tasks/update", answer)
            sent["ack"] = time.perf_counter()

        sender = threading.Thread(target=send)
        sender.start()  # the GET loop below runs while the update is in flight
        deadline = time.perf_counter() + 30
        while True:
            status = meta_status(meta_key)
            t1 = time.perf_counter()
            if status != "INPUT_REQUIRED":
                break
            if t1 > deadline:
                raise RuntimeError(f"task {task_id}: the job did not continue within 30 s")
        sender.join(30)
        assert "ack" in sent, "tasks/update got no answer"
        done = client.wait(task_id, timeout=30)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "published", done
        return t1 - sent["t0"], sent["ack"] - sent["t0"], t1 < sent["ack"]

    try:
        wait_for(server_up, 30, 0.1, "the HTTP server")
        for _ in range(args.warmup):
            one_round()
        cont: list[float] = []
        acks: list[float] = []
        early = 0
        for _ in range(args.runs):
            c, a, before = one_round()
            cont.append(c)
            acks.append(a)
            early += before
    finally:
        client.close()
        server.stop()
        worker.stop()

    print(f"input round-trip latency, {args.runs} runs of ask_one (after {args.warmup} warm-up runs)")
    print(f"  worker: prefork -c 4, server: mcp-celery serve --http (stateless JSON), Redis {base} DBs 14/15")
    print("  method: t0 = tasks/update sent (from a second thread); job continuing = first GET, in a tight loop")
    print("          running meanwhile, that finds the Celery meta key's status no longer INPUT_REQUIRED")
    print("          (the job woke from BLPOP on its bell and wrote STARTED)")
    print("  " + _summary("tasks/update -> job continues", cont))
    print("  " + _summary("tasks/update HTTP round trip", acks))
    print(f"  the job carried on before the client had the ack in {early}/{args.runs} runs")
    print(f"  logs: {logs.relative_to(ROOT) if logs.is_relative_to(ROOT) else logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
