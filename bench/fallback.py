"""The plain-host fallback's cost on the synchronous path, alone: `python -m bench.fallback [--quick] [--out FILE]`.

The `fallback` phase of `python -m bench` (`bench/phases/fallback_cost.py`), run by itself and written to
bench/results-fallback.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.config import RunConfig
from bench.goals import fallback_cost
from bench.phases.fallback_cost import run_fallback
from bench.procs import BENCH
from bench.redis_tools import BenchRedis
from bench.report import fallback_section
from bench.results import Results


def main() -> None:
    """This phase alone, written to bench/results-fallback.md."""
    ap = argparse.ArgumentParser(prog="python -m bench.fallback")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(BENCH / "results-fallback.md"))
    a = ap.parse_args()
    cfg = RunConfig.for_run(a.quick)
    results = Results(cfg)
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    started = time.monotonic()
    try:
        asyncio.run(run_fallback(cfg, rds, results))
    finally:
        rds.stop()
    goal = fallback_cost(results)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The plain-host fallback on the synchronous path (`python -m bench.fallback`)",
        "",
        f"One run, {when}, {time.monotonic() - started:.0f} s, {os.cpu_count()} cores; also a phase of every "
        "full `python -m bench`.",
        *fallback_section(results),
        "",
        f"Goal: {goal.description}: **{goal.status}**, {goal.figure}.",
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
