"""The cost of the server's own metrics: the same server with metrics on and off, interleaved.

Two `mcp-celery serve -A bench.bench_jobs --http` processes over the bench Redis, identical but for
MCP_CELERY_METRICS=false on one, are measured in alternating short slices (as the stored-task A/B
does, so that the machine's drift hits both sides alike): tasks/get c=1 on a finished task, then
tools/call-to-handle c=1 with the job worker paused (so the jobs' runs do not share the slices).
The figure is p50(on) / p50(off) per method, with a paired-round bootstrap 95% CI. Twice the
stored-task A/B's rounds: the effect looked for is smaller than the drift between rounds. A third
server, with metrics on too, is measured in the same rounds as a control: control / on is what two
identical servers differ by on this machine, the resolution of the on/off figure.

Beside it, drift-free: the CPU time the metrics code itself takes per request, timed in this process
around a handler that does nothing (`metrics.measured_tool_call` plus `record_created`, `metrics.measured`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench import rpc
from bench.config import RunConfig, say
from bench.load import Op
from bench.phases.ab import ab_stats
from bench.procs import paused, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from bench.results import MetricsCostFigures, Results
from bench.task_ops import create_op, get_op, task_id_of
from mcp_celery.server.ops import metrics
from mcp_celery.settings import Settings
from mcp_celery.testing.processes import Process

#: "control" is a second server with metrics on: control / on shows how far two identical servers differ here.
SIDES = ("on", "off", "control")
SKIP = 3  # the first requests of each slice: the side that was idle wakes up


async def run_metrics(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    with on_and_off_servers(rds, "metrics", {"MCP_CELERY_METRICS": "false"}) as (worker, urls):
        finished = {side: await _finished_task(url) for side, url in urls.items()}
        gets = {side: get_op(urls[side], [finished[side]]) for side in SIDES}
        rounds = 2 * cfg.ab_rounds
        get_rounds = await interleaved(urls, gets, rounds, cfg.ab_slice_s)
        with paused(worker):
            calls = {side: create_op(urls[side]) for side in SIDES}
            call_rounds = await interleaved(urls, calls, rounds, cfg.ab_slice_s)
        call_us, get_us = await code_cost_us()
        figures = results.metrics = MetricsCostFigures(
            get=ab_stats(get_rounds["on"], get_rounds["off"]),
            call=ab_stats(call_rounds["on"], call_rounds["off"]),
            get_control=ab_stats(get_rounds["control"], get_rounds["on"]),
            call_control=ab_stats(call_rounds["control"], call_rounds["on"]),
            rounds=rounds,
            slice_s=cfg.ab_slice_s,
            call_code_us=call_us,
            get_code_us=get_us,
        )
        results.notes.extend(_checked_sides(urls))
        for name, ab, aa in (
            ("tasks/get", figures.get, figures.get_control),
            ("tools/call", figures.call, figures.call_control),
        ):
            say(
                f"  metrics {name}: on p50 {ab.big_p50_ms:.3f} ms (n={ab.big_samples}), off {ab.small_p50_ms:.3f} ms "
                f"(n={ab.small_samples}); on/off {ab.ratio:.3f} (95% CI {ab.ci_low:.3f}-{ab.ci_high:.3f}); "
                f"control/on {aa.ratio:.3f} (95% CI {aa.ci_low:.3f}-{aa.ci_high:.3f})"
            )
        say(f"  metrics code per request: tools/call {call_us:.2f} µs, tasks/get {get_us:.2f} µs")


@contextmanager
def on_and_off_servers(rds: BenchRedis, name: str, off_env: dict[str, str]) -> Iterator[tuple[Process, dict[str, str]]]:
    """A prefork worker and one `mcp-celery serve` per side of `SIDES` over the bench Redis, `off_env` on the
    "off" side only; yields the worker and each side's URL once the worker is ready, and stops them all."""
    with servers_and_worker(rds, name, {side: off_env if side == "off" else {} for side in SIDES}) as started:
        yield started


@contextmanager
def servers_and_worker(
    rds: BenchRedis, name: str, envs: dict[str, dict[str, str]]
) -> Iterator[tuple[Process, dict[str, str]]]:
    """A prefork worker and one `mcp-celery serve` per side of `envs` (with that environment) over the bench
    Redis; yields the worker and each side's URL once the worker is ready, and stops them all."""
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which the entry point sets

    worker = start_worker(rds.url, f"worker-{name}")
    servers: dict[str, Process] = {}
    try:
        urls: dict[str, str] = {}
        for side, env in envs.items():
            servers[side], urls[side] = start_ours_server(rds.url, f"{name}-{side}-server", env=env)
        wait_worker(bench_jobs.app, worker)
        yield worker, urls
    finally:
        for server in servers.values():
            server.stop()
        worker.stop(timeout=15)


async def interleaved(
    urls: dict[str, str], ops: dict[str, Op], rounds: int, slice_s: float
) -> dict[str, list[list[float]]]:
    """`rounds` rounds of one c=1 slice of `ops[side]` per side, order alternating (reversed every other
    round), after a warm-up round.

    Returns each side's latencies (seconds) per round. Any error fails the phase: both sides must
    answer every request alike for the comparison to mean anything.
    """
    per_round: dict[str, list[list[float]]] = {side: [] for side in urls}
    clients = {side: rpc.new_client() for side in urls}
    counter = 0
    try:
        for rnd in range(-1, rounds):  # round -1: warm-up
            order = list(urls) if rnd % 2 == 0 else list(urls)[::-1]
            for side in order:
                latencies: list[float] = []
                end = time.monotonic() + (2 * slice_s if rnd < 0 else slice_s)
                while time.monotonic() < end:
                    counter += 1
                    started = time.perf_counter()
                    await ops[side](clients[side], counter)
                    latencies.append(time.perf_counter() - started)
                if rnd >= 0:
                    per_round[side].append(latencies[SKIP:])
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
    return per_round


async def code_cost_us(n: int = 50_000) -> tuple[float, float]:
    """CPU µs the metrics code adds to one tools/call (handle answer, task created) and one tasks/get."""

    async def handle(ctx: Any, params: Any) -> dict[str, str]:
        return {"resultType": "task"}

    async def created(ctx: Any, params: Any) -> dict[str, str]:
        metrics.record_created("noop")
        return {"resultType": "task"}

    class Params:
        name = "noop"

    async def per_call(handler: Any) -> float:
        started = time.process_time()
        for _ in range(n):
            await handler(None, Params)
        return (time.process_time() - started) / n * 1e6

    was_on = metrics.enabled()
    try:
        metrics.configure(Settings(metrics=False))
        bare = await per_call(handle)
        metrics.configure(Settings(metrics=True))
        call = await per_call(metrics.measured_tool_call(created, lambda name: name)) - bare
        get = await per_call(metrics.measured("tasks/get", handle)) - bare
    finally:
        metrics.configure(Settings(metrics=was_on))
    return max(call, 0.0), max(get, 0.0)


async def _finished_task(url: str) -> str:
    """A `noop` task run to completion on the server at `url`, for its tasks/get slices."""
    async with rpc.new_client() as client:
        task_id = task_id_of(await rpc.call_tool(client, url, "noop", {"x": 0}))
        end = time.monotonic() + 30
        while (await rpc.tasks_get(client, url, task_id)).get("status") != "completed":
            if time.monotonic() > end:
                raise rpc.RpcError(f"task {task_id} did not complete within 30 s")
            await asyncio.sleep(0.02)
    return task_id


def _checked_sides(urls: dict[str, str]) -> list[str]:
    """Notes when a side is not what it should be: `on` counted the slices, `off` serves no /metrics."""
    base = {side: url.removesuffix("/mcp") for side, url in urls.items()}
    on = httpx.get(f"{base['on']}/metrics", timeout=10)
    off = httpx.get(f"{base['off']}/metrics", timeout=10)
    notes = []
    if on.status_code != 200 or 'mcp_celery_requests_total{method="tasks/get",outcome="ok"}' not in on.text:
        notes.append(f"metrics phase: the 'on' server's /metrics did not count tasks/get ({on.status_code})")
    if off.status_code == 200:
        notes.append("metrics phase: the 'off' server served /metrics")
    return notes
