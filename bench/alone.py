"""One phase of `python -m bench` run by itself and written to a results file of its own.

`python -m bench.fallback` and `python -m bench.idempotency` are this, each with its phase, its report
section and its goal: the bench Redis, the phase, then the page (the run's time and machine, the section,
the goal's verdict), written and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.config import RunConfig
from bench.goals import Goal
from bench.procs import BENCH
from bench.redis_tools import BenchRedis
from bench.results import Results

__all__ = ["run_alone"]


def run_alone(
    prog: str,
    out: str,
    title: str,
    phase: Callable[[RunConfig, BenchRedis, Results], Awaitable[None]],
    section: Callable[[Results], list[str]],
    goal: Callable[[Results], Goal],
) -> None:
    """Parse `--quick` and `--out` (default bench/`out`), run `phase` on a bench Redis of its own, and write
    the page titled `title`."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(BENCH / out))
    a = ap.parse_args()
    results = Results(RunConfig.for_run(a.quick))
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    started = time.monotonic()
    try:
        asyncio.run(phase(results.config, rds, results))
    finally:
        rds.stop()
    judged = goal(results)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# {title} (`{prog}`)",
        "",
        f"One run, {when}, {time.monotonic() - started:.0f} s, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} as it ended: the machine is shared); also a phase of every full `python -m bench`.",
        *section(results),
        "",
        f"Goal: {judged.description}: **{judged.status}**, {judged.figure}.",
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
