"""Measurements shared by the two SEP-2663 task servers (ours and FastMCP), in the order they run.

1. a sanity call and an e2e warm-up, then the idle Redis traffic (background polling) to subtract;
2. Redis commands and memory per task: create N without polling, wait until Redis is idle again;
3. tasks/get on the finished tasks: c=1 latency, commands and read events per request;
4. (ours) the stored-task scaling windows, passed in as `scaling`;
5. tasks/get c=16, tools/call-to-handle c=1 and c=16, e2e at c=16, the synchronous path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import redis

from bench import rpc
from bench.config import RunConfig, say
from bench.load import run_load
from bench.redis_tools import (
    BenchRedis,
    cmd_delta,
    commandstats,
    connections_received,
    idle_rates,
    keys_stored,
    reads_processed,
    top_cmds,
    used_memory,
    wait_quiet,
)
from bench.results import Results, TaskServerFigures
from bench.task_ops import all_completed, create_many, create_op, e2e_op, get_op, sync_op


@dataclass
class Target:
    """One task server under test, with the Redis it stores into and where its figures go."""

    tag: str  # "ours" or "fastmcp": the prefix of its window names
    url: str
    rds: BenchRedis
    figures: TaskServerFigures
    results: Results
    cfg: RunConfig
    idle_cmds_per_s: float = 0.0
    idle_reads_per_s: float = 0.0
    #: Holds the server's job worker still for a block (ours: SIGSTOP/SIGCONT), so that a
    #: creation window measures the server alone, as the floor is measured; None: cannot.
    paused_jobs: Callable[[], AbstractContextManager[None]] | None = None
    redis: redis.Redis = field(init=False)  # one client for every count, as INFO reads go through it

    def __post_init__(self) -> None:
        self.redis = self.rds.client()


Scaling = Callable[[Target, list[str]], Awaitable[None]]


async def measure_task_server(target: Target, scaling: Scaling | None = None) -> None:
    """Every measurement of one task server, in order; `scaling` runs between tasks/get c=1 and c=16."""
    await warm_up(target)
    ids = await commands_and_memory(target)
    await gets_on_finished(target, ids)
    if scaling is not None:
        await scaling(target, ids)
    await later_windows(target, ids)


async def warm_up(t: Target) -> None:
    async with rpc.new_client() as c:
        h = await rpc.call_tool(c, t.url, "noop", {"x": 7})
        if h.get("resultType") != "task" or "taskId" not in h:
            raise RuntimeError(f"{t.tag}: tools/call did not return a task handle: {h}")
        t.figures.handle_example = {k: v for k, v in h.items() if k != "_meta"}
    warm = await run_load(e2e_op(t.url), 4, count=40 if t.cfg.quick else 100, warmup=0, deadline=60)
    if warm.errors:
        raise RuntimeError(f"{t.tag} warm-up e2e failed: {warm.first_error}")
    t.idle_cmds_per_s, t.idle_reads_per_s = idle_rates(t.redis, t.cfg.idle_window_s)
    t.figures.idle_cmds_per_s, t.figures.idle_reads_per_s = t.idle_cmds_per_s, t.idle_reads_per_s
    say(f"  {t.tag} idle Redis traffic: {t.idle_cmds_per_s:.1f} cmds/s, {t.idle_reads_per_s:.1f} reads/s")


async def commands_and_memory(t: Target) -> list[str]:
    """Create N tasks (no polling), wait for the worker to drain; returns the ids of the N tasks."""
    r, n, f = t.redis, t.cfg.tasks_in_memory_window, t.figures
    f.tasks_in_memory_window = n
    c0, m0, t0 = commandstats(r), used_memory(r), time.monotonic()
    ids = await create_many(t.url, n, 4)
    wait_quiet(r, t.idle_cmds_per_s, 120)
    c1, m1, dt = commandstats(r), used_memory(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    f.cmds_per_task = (sum(d.values()) - t.idle_cmds_per_s * dt) / n
    f.cmds_per_task_uncorrected = sum(d.values()) / n
    f.cmds_breakdown = top_cmds(d, n)
    f.mem_per_task_bytes = (m1 - m0) / n
    done = await all_completed(t.url, ids)
    if done != n:
        t.results.notes.append(f"{t.tag}: only {done}/{n} tasks completed after the drain")
    say(
        f"  {t.tag} Redis cmds per tools/call+job {f.cmds_per_task:.2f} ({f.cmds_breakdown}); "
        f"memory {f.mem_per_task_bytes:.0f} B/task"
    )
    f.keys_after_memory_window = keys_stored(r)
    return ids


async def gets_on_finished(t: Target, ids: list[str]) -> None:
    """tasks/get c=1 (with ~1,000 stored tasks), then commands and read events per sequential tasks/get."""
    r, f, k = t.redis, t.figures, t.cfg.gets_for_command_count
    res = await run_load(get_op(t.url, ids), 1, duration=t.cfg.window_s, warmup=t.cfg.warmup_s)
    f.get_c1 = t.results.window(f"{t.tag}.get.c1", res)
    async with rpc.new_client() as c:
        for i in range(20):
            await rpc.tasks_get(c, t.url, ids[i])
        c0, rd0, t0 = commandstats(r), reads_processed(r), time.monotonic()
        for i in range(k):
            await rpc.tasks_get(c, t.url, ids[i % len(ids)])
        rd1, c1, dt = reads_processed(r), commandstats(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    f.cmds_per_get = (sum(d.values()) - t.idle_cmds_per_s * dt) / k
    f.cmds_per_get_uncorrected = sum(d.values()) / k
    f.get_breakdown = top_cmds(d, k)
    f.round_trips_per_get = (rd1 - rd0 - 1 - t.idle_reads_per_s * dt) / k  # -1: the INFO that reads the counter
    say(
        f"  {t.tag} per tasks/get: {f.cmds_per_get:.2f} cmds ({f.get_breakdown}), "
        f"{f.round_trips_per_get:.2f} Redis round trips"
    )


async def later_windows(t: Target, ids: list[str]) -> None:
    """tasks/get c=16, tools/call-to-handle c=1 and c=16, e2e c=16, then the synchronous path."""
    cfg, f, r = t.cfg, t.figures, t.redis
    res = await run_load(get_op(t.url, ids), 16, duration=cfg.window_s, warmup=cfg.warmup_s)
    f.get_c16 = t.results.window(f"{t.tag}.get.c16", res)
    # the worker runs the created jobs meanwhile; let it drain after each window
    res = await run_load(create_op(t.url), 1, duration=cfg.window_s, warmup=cfg.warmup_s)
    f.call_c1 = t.results.window(f"{t.tag}.call.c1", res)
    wait_quiet(r, t.idle_cmds_per_s, 180)
    res = await run_load(create_op(t.url), 16, duration=cfg.window_s, warmup=cfg.warmup_s)
    f.call_c16 = t.results.window(f"{t.tag}.call.c16", res)
    wait_quiet(r, t.idle_cmds_per_s, 180)
    if t.paused_jobs is not None:
        # The same window with the worker stopped: on two shared cores, the worker running the
        # jobs created meanwhile takes CPU the floor's windows never lose. It runs them after.
        with t.paused_jobs():
            res = await run_load(create_op(t.url), 16, duration=cfg.window_s, warmup=cfg.warmup_s)
        f.call_c16_alone = t.results.window(f"{t.tag}.call.c16.worker-paused", res)
        wait_quiet(r, t.idle_cmds_per_s, 180)
    res = await run_load(e2e_op(t.url), 16, count=cfg.tasks_in_e2e_window, warmup=cfg.warmup_s, deadline=300)
    f.e2e_c16 = t.results.window(f"{t.tag}.e2e.c16", res)
    wait_quiet(r, t.idle_cmds_per_s, 60)
    await sync_path(t)


async def sync_path(t: Target) -> None:
    """No extension declared: a plain CallToolResult. Latency c=1, then Redis cost per call."""
    f, r, k = t.figures, t.redis, 100
    res = await run_load(sync_op(t.url), 1, count=t.cfg.sync_calls, warmup=t.cfg.warmup_s, deadline=120)
    f.sync_c1 = t.results.window(f"{t.tag}.sync.c1", res)
    op = sync_op(t.url)
    async with rpc.new_client() as c:
        c0, n0, t0 = commandstats(r), connections_received(r), time.monotonic()
        for i in range(k):
            await op(c, i)
        n1, c1, dt = connections_received(r), commandstats(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    f.sync_new_conns_per_call = (n1 - n0) / k
    f.sync_cmds_per_call = (sum(d.values()) - t.idle_cmds_per_s * dt) / k
    f.sync_breakdown = top_cmds(d, k)
    say(
        f"  {t.tag} sync path per call: {f.sync_cmds_per_call:.1f} Redis cmds ({f.sync_breakdown}), "
        f"{f.sync_new_conns_per_call:.2f} new Redis connections"
    )
