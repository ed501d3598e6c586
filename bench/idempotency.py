"""The cost of an idempotency key on `tools/call`, alone: `python -m bench.idempotency [--quick] [--out FILE]`.

The `idempotency` phase of `python -m bench` (`bench/phases/idempotency_cost.py`), run by itself and written to
bench/results-idempotency.md (issue 47: with a key at most 1.1x without, p50, same run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.config import RunConfig
from bench.goals import idempotency_cost
from bench.phases.idempotency_cost import run_idempotency
from bench.procs import BENCH
from bench.redis_tools import BenchRedis
from bench.report import idempotency_section
from bench.results import Results


def main() -> None:
    """This phase alone, written to bench/results-idempotency.md."""
    ap = argparse.ArgumentParser(prog="python -m bench.idempotency")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(BENCH / "results-idempotency.md"))
    a = ap.parse_args()
    cfg = RunConfig.for_run(a.quick)
    results = Results(cfg)
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    started = time.monotonic()
    try:
        asyncio.run(run_idempotency(cfg, rds, results))
    finally:
        rds.stop()
    goal = idempotency_cost(results)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Idempotency keys on `tools/call` (`python -m bench.idempotency`)",
        "",
        f"One run, {when}, {time.monotonic() - started:.0f} s, {os.cpu_count()} cores; also a phase of every "
        "full `python -m bench`.",
        *idempotency_section(results),
        "",
        f"Goal: {goal.description}: **{goal.status}**, {goal.figure}.",
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
