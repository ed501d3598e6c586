"""Before/after on a shared machine: two source trees' servers and the floor, interleaved in short rounds.

python -m bench.compare BASE_DIR [--rounds N] [--window S] [--ops create1,create16,sync1,e2e16,listen16]

BASE_DIR is another checkout of this repository (e.g. `git worktree add /tmp/base main`, or
`git archive main | tar -x -C /tmp/base`). One private Redis and one prefork worker serve both
`mcp-celery serve` processes: `base` runs BASE_DIR's code, `new` this checkout's. Each round runs
every operation against floor, base and new in turn, for `--window` seconds each, so load from
other processes falls on all three alike; the report gives each side's median over rounds of the
per-window p50 (latency) and rate, and new/base and new/floor ratios. For a change's effect, this
is steadier than two full `python -m bench` runs minutes apart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from bench.load import LoadResult, Op, run_load
from bench.phases.baselines import call_noop
from bench.procs import (
    LOGS,
    MY_SESSIONS,
    PY,
    ROOT,
    http_answers,
    start_http_server,
    worker_on_private_redis,
    write_report,
)
from bench.push import batch_push_op
from bench.task_ops import create_op, e2e_op, sync_op
from mcp_celery.testing.processes import Process, free_port

#: name -> (concurrency, operation on a task server, operation on the floor or None)
OPS: dict[str, tuple[int, Callable[[str], Op], Callable[[str], Op] | None]] = {
    "create1": (1, create_op, call_noop),
    "create16": (16, create_op, call_noop),
    "sync1": (1, sync_op, call_noop),
    "e2e16": (16, e2e_op, None),
    "listen16": (16, batch_push_op, None),  # per op: 16 tasks created, then one listen stream over them
}


def start_server(source: Path, redis_url: str, name: str) -> tuple[Process, str]:
    """`mcp-celery serve` running the code in `source` (its own directory first on sys.path)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    argv = [PY, "-m", "mcp_celery", "serve", "-A", "bench.bench_jobs", "--http", "--port", str(port)]
    # `python -m` puts the working directory first on sys.path: run from `source`, so that its code is used.
    env = {**os.environ, "BENCH_REDIS_URL": redis_url, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1"}
    proc = Process(argv, env, LOGS / f"{name}.log", cwd=source)
    MY_SESSIONS.add(proc.pid)
    try:
        proc.wait_ready(lambda: http_answers(url), 60, name)
    except RuntimeError:
        proc.stop()
        raise
    return proc, url


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    targets: dict[str, tuple[str, int]], ops: list[str], rounds: int, window_s: float
) -> dict[str, list[LoadResult]]:
    """Every op against every side, round after round; each result carries the server's CPU ms per op."""
    out: dict[str, list[LoadResult]] = {}
    for r in range(rounds):
        for op_name in ops:
            conc, op, floor_op = OPS[op_name]
            for side, (url, pid) in targets.items():
                make = floor_op if side == "floor" else op
                if make is None:
                    continue
                await run_load(make(url), conc, duration=0.3, warmup=0, deadline=60)  # warm-up, unrecorded
                before = cpu_s(pid)
                res = await run_load(make(url), conc, duration=window_s, warmup=0, deadline=window_s + 60)
                res.server_cpu_ms = (cpu_s(pid) - before) * 1000 / max(1, res.n)  # type: ignore[attr-defined]
                out.setdefault(f"{op_name} {side}", []).append(res)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return out


def report(results: dict[str, list[LoadResult]], ops: list[str]) -> str:
    def med(key: str, f: Callable[[LoadResult], float]) -> float:
        return statistics.median(f(x) for x in results[key]) if key in results else float("nan")

    head = "| op | side | p50 ms | rate /s | server CPU ms/op | foreign | new/base p50 | new/base rate | /floor p50 |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for op_name in ops:
        for side in ("floor", "base", "new"):
            key = f"{op_name} {side}"
            if key not in results:
                continue
            p50, rate = med(key, lambda x: x.p50), med(key, lambda x: x.rate)
            foreign = med(key, lambda x: x.foreign_cpu)
            vs_base = vs_floor = ""
            if side == "new":
                vs_base = f"{p50 / med(f'{op_name} base', lambda x: x.p50):.2f}x"
                vs_base_rate = f"{rate / med(f'{op_name} base', lambda x: x.rate):.2f}x"
            else:
                vs_base_rate = ""
            if side != "floor" and f"{op_name} floor" in results:
                vs_floor = f"{p50 / med(f'{op_name} floor', lambda x: x.p50):.2f}x"
            cpu = med(key, lambda x: float(getattr(x, "server_cpu_ms", float("nan"))))
            cells = [op_name, side, f"{p50:.2f}", f"{rate:.0f}", f"{cpu:.2f}", f"{foreign:.0%}", vs_base, vs_base_rate]
            cells.append(vs_floor)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.compare")
    ap.add_argument("base", type=Path, help="another checkout of this repository (the 'before')")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--ops", default="create1,create16,sync1,e2e16")
    a = ap.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    with worker_on_private_redis("compare") as (redis_url, procs):
        floor_port = free_port()
        floor_url = f"http://127.0.0.1:{floor_port}/mcp"
        floor = start_http_server("floor-compare", [PY, "-m", "bench.floor_server", str(floor_port)], floor_url)
        procs.append(floor)
        base, base_url = start_server(a.base.resolve(), redis_url, "base-compare")
        procs.append(base)
        new, new_url = start_server(ROOT, redis_url, "new-compare")
        procs.append(new)
        targets = {"floor": (floor_url, floor.pid), "base": (base_url, base.pid), "new": (new_url, new.pid)}
        results = asyncio.run(measure(targets, ops, a.rounds, a.window))
        write_report("compare", report(results, ops))


if __name__ == "__main__":
    main()
