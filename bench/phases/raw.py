"""The raw phase: plain Celery (`bench_jobs.raw_noop`) on the same app configuration as ours.

apply_async latency, delay().get() round trip, Redis commands and memory per task (publish N, let the
worker drain), end to end (publish N, then get all) and AsyncResult(id).state reads. Runs in a thread:
Celery's client calls block.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
from celery.result import AsyncResult

from bench.config import RunConfig, say
from bench.load import percentile_ms
from bench.procs import CpuProbe, start_worker, wait_worker
from bench.redis_tools import BenchRedis, cmd_delta, commandstats, idle_rates, top_cmds, used_memory, wait_quiet
from bench.results import RawFigures, Results

CONFIG_KEYS = (
    "task_acks_late",
    "worker_prefetch_multiplier",
    "worker_disable_prefetch",
    "task_track_started",
    "result_extended",
    "worker_send_task_events",
    "task_send_sent_event",
    "result_expires",
)


async def run_raw(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    await asyncio.to_thread(measure_raw, cfg, rds, results)


def measure_raw(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which the entry point sets

    app, task, figures = bench_jobs.app, bench_jobs.raw_noop, results.raw
    figures.app_config = "mcp_celery.configure_app(app): " + ", ".join(f"{k}={app.conf.get(k)!r}" for k in CONFIG_KEYS)
    r = rds.client()
    worker = start_worker(rds.url, "worker-raw")
    try:
        wait_worker(app, worker)
        for i in range(50):  # warm-up
            task.delay(i).get(timeout=10)
        idle_cps, _ = idle_rates(r, cfg.idle_window_s)
        figures.idle_cmds_per_s = idle_cps
        apply_latency(cfg, task, figures)
        wait_quiet(r, idle_cps, 60)
        roundtrip(cfg, task, figures, results)
        commands_and_memory(cfg, task, r, idle_cps, figures)
        finished = end_to_end(cfg, task, figures, results)
        state_reads(cfg, app, finished, r, idle_cps, figures)
    finally:
        worker.stop(timeout=15)


def apply_latency(cfg: RunConfig, task: Any, figures: RawFigures) -> None:
    lat = []
    for i in range(cfg.raw_latency_samples):
        t0 = time.perf_counter()
        task.apply_async((i,))
        lat.append(time.perf_counter() - t0)
    figures.apply_p50_ms, figures.apply_p95_ms = percentile_ms(lat, 50), percentile_ms(lat, 95)


def roundtrip(cfg: RunConfig, task: Any, figures: RawFigures, results: Results) -> None:
    """delay().get(), one at a time."""
    cpu0 = CpuProbe.sample()
    lat = []
    for i in range(cfg.raw_latency_samples):
        t0 = time.perf_counter()
        task.delay(i).get(timeout=10)
        lat.append(time.perf_counter() - t0)
    figures.roundtrip_p50_ms, figures.roundtrip_p95_ms = percentile_ms(lat, 50), percentile_ms(lat, 95)
    results.foreign_cpu.append(("raw.rt", CpuProbe.foreign(cpu0, CpuProbe.sample())))
    say(
        f"  raw apply_async p50 {figures.apply_p50_ms:.2f}ms; delay().get() p50 {figures.roundtrip_p50_ms:.2f}ms "
        f"p95 {figures.roundtrip_p95_ms:.2f}ms"
    )


def commands_and_memory(cfg: RunConfig, task: Any, r: redis.Redis, idle_cps: float, figures: RawFigures) -> None:
    """Redis commands and memory per task: publish N (no get), wait for the worker to drain."""
    n = cfg.tasks_in_memory_window
    c0, m0, t0 = commandstats(r), used_memory(r), time.monotonic()
    for i in range(n):
        task.apply_async((i,))
    wait_quiet(r, idle_cps, 120)
    c1, m1, dt = commandstats(r), used_memory(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    figures.cmds_per_task = (sum(d.values()) - idle_cps * dt) / n
    figures.cmds_per_task_uncorrected = sum(d.values()) / n
    figures.cmds_breakdown = top_cmds(d, n)
    figures.mem_per_task_bytes = (m1 - m0) / n
    say(f"  raw Redis cmds/task {figures.cmds_per_task:.2f} (idle-corrected; {figures.cmds_breakdown})")


def end_to_end(cfg: RunConfig, task: Any, figures: RawFigures, results: Results) -> list[str]:
    """Publish N, then get all; returns the ids of the finished tasks."""
    n = cfg.raw_e2e_tasks
    cpu0 = CpuProbe.sample()
    t0 = time.perf_counter()
    ars = [task.apply_async((i,)) for i in range(n)]
    t_pub = time.perf_counter() - t0
    for ar in ars:
        ar.get(timeout=120)
    figures.e2e_tasks_per_s = n / (time.perf_counter() - t0)
    figures.publish_msgs_per_s = n / t_pub
    results.foreign_cpu.append(("raw.e2e", CpuProbe.foreign(cpu0, CpuProbe.sample())))
    say(f"  raw e2e {figures.e2e_tasks_per_s:.0f} tasks/s (publish {figures.publish_msgs_per_s:.0f} msg/s)")
    return [a.id for a in ars]


def state_reads(
    cfg: RunConfig, app: Any, finished: list[str], r: redis.Redis, idle_cps: float, figures: RawFigures
) -> None:
    """AsyncResult(id).state reads/s on finished tasks (single thread), and commands per read."""
    k, t0 = 0, time.perf_counter()
    c0 = commandstats(r)
    end = t0 + cfg.window_s
    while time.perf_counter() < end:
        st = AsyncResult(finished[k % len(finished)], app=app).state
        assert st == "SUCCESS", st
        k += 1
    el = time.perf_counter() - t0
    c1 = commandstats(r)
    figures.state_reads_per_s = k / el
    figures.cmds_per_state_read = (sum(cmd_delta(c0, c1).values()) - idle_cps * el) / k
    say(f"  raw AsyncResult.state {figures.state_reads_per_s:.0f}/s, {figures.cmds_per_state_read:.2f} cmds/read")
