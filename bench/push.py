"""Push against polling against raw Celery, side by side in one run: `python -m bench.push [--quick]`.

Starts a private redis-server, one prefork worker (c=2) and `mcp-celery serve --http`, then measures:

- delay from a job's `ctx.status()` to the `notifications/tasks` carrying it at a listening client
  (the job stamps the wall clock into the message; client and job share the machine's clock);
- end-to-end throughput of trivial jobs, 16 clients: `tools/call`, then `subscriptions/listen`
  until the task ends (push, one stream per task); each client creating 16 tasks, then one
  `subscriptions/listen` over the 16 until all end (push in batches: the raw Celery row's own
  pattern, publish then collect); `tasks/get` every 10 ms (polling, as `python -m bench` does);
  and raw Celery (publish N, then `.get()` each) on the same worker.

Writes bench/results-push.md and prints the same table.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import load, procs, rpc
from mcp_celery.testing.processes import Process, free_port, start_redis, wait_for

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LOGS = BENCH / ".logs"
POLL_S = 0.010
CONCURRENCY = 16
#: Tasks a client creates before it listens to all of them on one stream (the batched push row).
BATCH = 16
TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass
class PushFigures:
    delay_ms: list[float]
    push_rate: float
    batch_rate: float
    poll_rate: float
    raw_rate: float
    tasks: int


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def notifications(
    client: httpx.AsyncClient, url: str, task_ids: list[str]
) -> AsyncGenerator[tuple[float, dict[str, Any]]]:
    """The `notifications/tasks` params of one listen stream with their arrival times, until its result."""
    headers, body = rpc.request("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, task_ids[0])
    async with client.stream("POST", url, headers=headers, content=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("method") == "notifications/tasks":
                yield time.time(), message["params"]
            elif "result" in message or "error" in message:
                return


async def listen_until_terminal(
    client: httpx.AsyncClient, url: str, task_id: str
) -> list[tuple[float, dict[str, Any]]]:
    """The notifications of one listen stream with their arrival times, until the task is terminal."""
    seen: list[tuple[float, dict[str, Any]]] = []
    async with aclosing(notifications(client, url, [task_id])) as stream:  # closed at once: the connection is reused
        async for arrived, params in stream:
            seen.append((arrived, params))
            if params["status"] in TERMINAL:
                break
    return seen


async def listen_until_all_terminal(client: httpx.AsyncClient, url: str, task_ids: list[str]) -> dict[str, str]:
    """The final status of each task of one listen stream over `task_ids`, once all have ended."""
    ended: dict[str, str] = {}
    async with aclosing(notifications(client, url, task_ids)) as stream:
        async for _, params in stream:
            if params["status"] in TERMINAL:
                ended[params["taskId"]] = params["status"]
                if len(ended) == len(task_ids):
                    break
    return ended


def batch_push_op(url: str, tool: str = "noop") -> load.Op:
    """Create BATCH tasks of `tool`, then listen to all of them on one stream until every one has completed."""

    async def op(client: httpx.AsyncClient, i: int) -> None:
        task_ids = []
        for k in range(BATCH):
            handle = await rpc.call_tool(client, url, tool, {"x": i * BATCH + k})
            if handle.get("resultType") != "task":
                raise rpc.RpcError(f"not a task: {handle}")
            task_ids.append(handle["taskId"])
        ended = await listen_until_all_terminal(client, url, task_ids)
        if sorted(ended.values()) != ["completed"] * BATCH:
            raise rpc.RpcError(f"not all of {task_ids} completed: {ended}")

    return op


def push_op(url: str) -> load.Op:
    async def op(client: httpx.AsyncClient, i: int) -> None:
        handle = await rpc.call_tool(client, url, "noop", {"x": i})
        if handle.get("resultType") != "task":
            raise rpc.RpcError(f"not a task: {handle}")
        seen = await listen_until_terminal(client, url, handle["taskId"])
        if not seen or seen[-1][1]["status"] != "completed":
            raise rpc.RpcError(f"task {handle['taskId']} did not complete: {seen[-1:] or 'no notification'}")

    return op


def poll_op(url: str) -> load.Op:
    async def op(client: httpx.AsyncClient, i: int) -> None:
        handle = await rpc.call_tool(client, url, "noop", {"x": i})
        task_id = handle["taskId"]
        while True:
            await asyncio.sleep(POLL_S)
            status = (await rpc.tasks_get(client, url, task_id)).get("status")
            if status == "completed":
                return
            if status in {"failed", "cancelled"}:
                raise rpc.RpcError(f"task {task_id} {status}")

    return op


async def measure_delay(url: str, stamps: int) -> list[float]:
    """Milliseconds from each `ctx.status()` of the `stamps` job to its notification at this client."""
    async with rpc.new_client() as client:
        handle = await rpc.call_tool(client, url, "stamps", {"count": stamps, "interval_s": 0.02})
        seen = await listen_until_terminal(client, url, handle["taskId"])
    delays = []
    for arrived, task in seen:
        message = task.get("statusMessage") or ""
        if task["status"] == "working" and message.startswith("t="):
            delays.append((arrived - float(message[2:])) * 1000)
    return delays


async def throughput(op: load.Op, tasks: int, tasks_per_op: int = 1) -> float:
    result = await load.run_load(op, CONCURRENCY, count=tasks // tasks_per_op, warmup=0, deadline=600, max_errors=5)
    if result.errors:
        raise RuntimeError(f"{result.errors} errors, first: {result.first_error}")
    return tasks // tasks_per_op * tasks_per_op / result.elapsed


def raw_rate(tasks: int) -> float:
    from bench import bench_jobs

    started = time.perf_counter()
    results = [bench_jobs.raw_noop.apply_async((i,)) for i in range(tasks)]
    for result in results:
        result.get(timeout=120)
    return tasks / (time.perf_counter() - started)


def run(quick: bool) -> PushFigures:
    tasks = 600 if quick else 3000
    redis_url, redis_proc = start_redis(LOGS / "push-redis.log")
    # Before bench.bench_jobs is imported: it builds its app from this.
    os.environ["BENCH_REDIS_URL"] = redis_url
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = Process(
        [sys.executable, "-m", "celery", "-A", "bench.bench_jobs", "worker", "-P", "prefork", "-c", "2",
         "--without-gossip", "--without-mingle", "-l", "WARNING", "-n", "push@%h"],
        env, LOGS / "push-worker.log", cwd=ROOT,
    )  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = Process(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "bench.bench_jobs", "--http", "--port", str(port)],
        env,
        LOGS / "push-server.log",
        cwd=ROOT,
    )
    try:
        from bench import bench_jobs

        wait_for(lambda: bench_jobs.app.control.ping(timeout=0.5), 60, 0.2, "the worker")
        server.wait_ready(lambda: _answers(url), 60, "the server")
        for i in range(50):  # warm-up, both paths
            bench_jobs.raw_noop.delay(i).get(timeout=10)
        asyncio.run(throughput(push_op(url), 100))
        delays = asyncio.run(measure_delay(url, 100 if quick else 400))
        raw = raw_rate(tasks)
        push = asyncio.run(throughput(push_op(url), tasks))
        batch = asyncio.run(throughput(batch_push_op(url), tasks, BATCH))
        poll = asyncio.run(throughput(poll_op(url), tasks))
        return PushFigures(delays, push, batch, poll, raw, tasks)
    finally:
        server.stop()
        worker.stop()
        redis_proc.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, content=b"{}", timeout=1).status_code < 500
    except httpx.TransportError:
        return False


def report(f: PushFigures) -> str:
    p50, p95 = percentile(f.delay_ms, 50), percentile(f.delay_ms, 95)
    rows = [
        ("ctx.status() to notifications/tasks, p50", f"{p50:.2f} ms", "under 10 ms", p50 < 10),
        ("ctx.status() to notifications/tasks, p95", f"{p95:.2f} ms", "under 25 ms", p95 < 25),
        (
            f"end to end, {CONCURRENCY} clients listening (push), one stream per task",
            f"{f.push_rate:.0f} tasks/s = {f.push_rate / f.raw_rate:.0%} of raw Celery",
            "at least 70% of raw Celery",
            f.push_rate >= 0.7 * f.raw_rate,
        ),
        (
            f"end to end, {CONCURRENCY} clients listening (push), {BATCH} tasks created then one stream over them",
            f"{f.batch_rate:.0f} tasks/s = {f.batch_rate / f.raw_rate:.0%} of raw Celery",
            "at least 70% of raw Celery",
            f.batch_rate >= 0.7 * f.raw_rate,
        ),
        (
            f"end to end, {CONCURRENCY} clients polling every 10 ms",
            f"{f.poll_rate:.0f} tasks/s = {f.poll_rate / f.raw_rate:.0%} of raw Celery",
            "(reference)",
            None,
        ),
        ("raw Celery: publish N, then .get() each", f"{f.raw_rate:.0f} tasks/s", "(reference)", None),
    ]
    lines = [
        "# Push against polling (`python -m bench.push`)",
        "",
        f"One run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, one private redis-server, one prefork "
        f"worker (c=2), one `mcp-celery serve --http` process; {f.tasks} trivial tasks per throughput row, "
        f"{len(f.delay_ms)} status messages for the delay.",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
    ]
    for name, value, goal, met in rows:
        verdict = "" if met is None else ("MET" if met else "MISSED")
        lines.append(f"| {name} | {value} | {goal} | {verdict} |")
    mean = statistics.fmean(f.delay_ms)
    lines += ["", f"Delay: min {min(f.delay_ms):.2f} ms, mean {mean:.2f} ms, max {max(f.delay_ms):.2f} ms."]
    return "\n".join(lines) + "\n"


def main() -> None:
    procs.report_main("bench.push", __doc__ or "", BENCH / "results-push.md", lambda quick: report(run(quick)))


if __name__ == "__main__":
    main()
