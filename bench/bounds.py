"""What bounds the goals of issue 26, measured in one run rather than added up from separate ones.

python -m bench.bounds [--rounds N] [--window S] [--ops sync1,create16,e2e16,listen16]

Four sides share one private Redis and one prefork worker, and take turns in short windows, round
after round, so that load from elsewhere and the worker's own CPU fall on all of them alike:

- floor: the empty SDK server (`bench.floor_server`), for creation's goal;
- celery floor: the same empty server whose tool is raw Celery's own client (`bench.celery_floor_server`):
  the least any MCP server in front of Celery pays, on the same two cores as its worker;
- ours: `mcp-celery serve`;
- raw: Celery's client in this process, no server (`delay().get()`; for e2e16 and listen16, publish
  then get all).

Ops: sync1 (a plain `tools/call`, c=1), create16 (`tools/call` to a task handle, c=16, the worker
running the jobs), e2e16 (create, then `tasks/get` every 10 ms until completed) and listen16 (create
16, then one `subscriptions/listen` over them), the last two at c=16.

Per op the report gives each side's median over rounds of the window's p50 and rate (tasks/s), the
CPU per task of the server, the worker (its pool included), Redis and the load client (on two shared
cores the rate is about the inverse of their sum), and three ratios: the goal's (ours against its
reference), the bound's (the celery floor against the same reference) and ours against the celery
floor (what is ours to cut).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from bench.compare import cpu_s
from bench.cpu_split import self_cpu_s, tree_cpu_s
from bench.load import Op, percentile_ms, run_load
from bench.phases.baselines import call_noop
from bench.procs import PY, CpuProbe, start_http_server, start_ours_server, worker_on_private_redis, write_report
from bench.push import BATCH, batch_push_op
from bench.task_ops import create_op, e2e_op, sync_op
from mcp_celery.testing.processes import free_port

RAW_E2E_TASKS = 400  # one raw end-to-end window: publish these, then get them all


@dataclass
class Window:
    p50_ms: float
    rate: float
    server_cpu_ms: float  # per task; nan for raw, which has no server
    foreign: float  # share of the machine's CPU used by processes not the bench's
    others_cpu_ms: dict[str, float]  # per task: the worker (pool included), Redis and the load client (this process)


@dataclass(frozen=True)
class Shared:
    """The processes every side shares, whose CPU per task is read in each window too."""

    worker_pid: int
    redis_pid: int

    def sample(self) -> dict[str, float]:
        return {"worker": tree_cpu_s(self.worker_pid), "redis": cpu_s(self.redis_pid), "client": self_cpu_s()}

    @staticmethod
    def per_task(before: dict[str, float], after: dict[str, float], tasks: int) -> dict[str, float]:
        return {name: (after[name] - before[name]) * 1000 / max(1, tasks) for name in before}


@dataclass(frozen=True)
class Kind:
    """One operation of the run: its load, its goal's reference side and what each server side runs."""

    concurrency: int
    reference: str  # "raw" (Celery's client in this process) or "floor"
    latency: bool  # the goal is about p50 (else about rate)
    sides: dict[str, Callable[[str], Op]]
    tasks_per_op: int = 1
    ops_per_window: int | None = None  # a fixed count per window instead of a fixed duration


KINDS: dict[str, Kind] = {
    "sync1": Kind(1, "raw", True, {"celery floor": lambda u: sync_op(u, "raw_noop"), "ours": sync_op}),
    "create16": Kind(
        16, "floor", False, {"floor": call_noop, "celery floor": lambda u: create_op(u, "raw_noop"), "ours": create_op}
    ),
    "e2e16": Kind(16, "raw", False, {"celery floor": lambda u: e2e_op(u, "raw_noop"), "ours": e2e_op}),
    "listen16": Kind(
        16, "raw", False, {"celery floor": lambda u: batch_push_op(u, "raw_noop"), "ours": batch_push_op}, BATCH, 4 * 16
    ),
}


async def server_window(
    url: str, pid: int, shared: Shared, kind: Kind, make: Callable[[str], Op], window_s: float
) -> Window:
    op = make(url)
    await run_load(op, kind.concurrency, count=kind.concurrency, warmup=0, deadline=60)  # warm-up, unrecorded
    before, others = cpu_s(pid), shared.sample()
    if kind.ops_per_window is None:
        res = await run_load(op, kind.concurrency, duration=window_s, warmup=0, deadline=window_s + 60)
    else:
        res = await run_load(op, kind.concurrency, count=kind.ops_per_window, warmup=0, deadline=120)
    if res.errors:
        raise RuntimeError(f"{url}: {res.errors} errors, first: {res.first_error}")
    tasks = res.n * kind.tasks_per_op
    cpu_ms = (cpu_s(pid) - before) * 1000 / max(1, tasks)
    others_ms = Shared.per_task(others, shared.sample(), tasks)
    return Window(res.p50, res.rate * kind.tasks_per_op, cpu_ms, res.foreign_cpu, others_ms)


def raw_window(shared: Shared, kind: Kind, window_s: float) -> Window:
    """Raw Celery's client, blocking, on this thread: `delay().get()` one at a time for a latency
    goal, else a backlog (publish RAW_E2E_TASKS, then get them all), as `python -m bench` measures it."""
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

    task = bench_jobs.raw_noop
    for i in range(20):  # warm-up
        task.delay(i).get(timeout=10)
    cpu0, others = CpuProbe.sample(), shared.sample()
    lat: list[float] = []
    t0 = time.perf_counter()
    if kind.latency:
        while time.perf_counter() - t0 < window_s:
            t1 = time.perf_counter()
            task.delay(len(lat)).get(timeout=10)
            lat.append(time.perf_counter() - t1)
    else:
        for result in [task.apply_async((i,)) for i in range(RAW_E2E_TASKS)]:
            result.get(timeout=120)
            lat.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t0
    others_ms = Shared.per_task(others, shared.sample(), len(lat))
    foreign = CpuProbe.foreign(cpu0, CpuProbe.sample())
    return Window(percentile_ms(lat, 50), len(lat) / elapsed, float("nan"), foreign, others_ms)


async def measure(
    servers: dict[str, tuple[str, int]], shared: Shared, names: list[str], rounds: int, window_s: float
) -> dict[str, list[Window]]:
    """Every kind on every side, round after round; keyed "kind side"."""
    out: dict[str, list[Window]] = {}
    for r in range(rounds):
        for name in names:
            kind = KINDS[name]
            for side, make in kind.sides.items():
                url, pid = servers[side]
                out.setdefault(f"{name} {side}", []).append(await server_window(url, pid, shared, kind, make, window_s))
            if kind.reference == "raw":
                out.setdefault(f"{name} raw", []).append(await asyncio.to_thread(raw_window, shared, kind, window_s))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return out


def report(results: dict[str, list[Window]], names: list[str]) -> str:
    def med(key: str, f: Callable[[Window], float]) -> float:
        return statistics.median(f(w) for w in results[key])

    def med_other(key: str, other: str) -> float:
        return statistics.median(w.others_cpu_ms[other] for w in results[key])

    lines = [
        "| op | side | p50 ms | tasks/s | CPU ms/task: server | worker | Redis | client | foreign CPU "
        "| against the reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        kind = KINDS[name]
        figure: Callable[[Window], float] = (lambda w: w.p50_ms) if kind.latency else (lambda w: w.rate)
        ref = med(f"{name} {kind.reference}", figure)
        for side in [kind.reference, *(s for s in kind.sides if s != kind.reference)]:
            key = f"{name} {side}"
            cells = [
                name,
                side,
                f"{med(key, lambda w: w.p50_ms):.2f}",
                f"{med(key, lambda w: w.rate):.0f}",
                f"{med(key, lambda w: w.server_cpu_ms):.2f}",
                *(f"{med_other(key, other):.2f}" for other in ("worker", "redis", "client")),
                f"{med(key, lambda w: w.foreign):.0%}",
                "" if side == kind.reference else f"{med(key, figure) / ref:.2f}x",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        ours, bound = med(f"{name} ours", figure), med(f"{name} celery floor", figure)
        lines.append(f"| {name} | ours / celery floor | | | | | | | | {ours / bound:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bounds")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--ops", default=",".join(KINDS))
    a = ap.parse_args()
    names = [o for o in a.ops.split(",") if o]
    unknown = set(names) - set(KINDS)
    if unknown:
        ap.error(f"unknown ops {sorted(unknown)}; known: {', '.join(KINDS)}")
    with worker_on_private_redis("bounds") as (redis_url, procs):
        servers: dict[str, tuple[str, int]] = {}
        for side, module in (("floor", "bench.floor_server"), ("celery floor", "bench.celery_floor_server")):
            port = free_port()
            url = f"http://127.0.0.1:{port}/mcp"
            proc = start_http_server(f"{module.rsplit('.', 1)[1]}-bounds", [PY, "-m", module, str(port)], url)
            procs.append(proc)
            servers[side] = (url, proc.pid)
        ours, ours_url = start_ours_server(redis_url, "ours-bounds")
        procs.append(ours)
        servers["ours"] = (ours_url, ours.pid)
        shared = Shared(procs[0].pid, int(redis.Redis.from_url(redis_url).info("server")["process_id"]))
        results = asyncio.run(measure(servers, shared, names, a.rounds, a.window))
        write_report("bounds", report(results, names))


if __name__ == "__main__":
    main()
