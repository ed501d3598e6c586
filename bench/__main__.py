"""python -m bench [--quick] [--skip PHASE ...] [--out FILE]: run every phase, print a table, write bench/results.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import traceback
from pathlib import Path

from bench.config import RunConfig, say
from bench.goals import judge
from bench.phases import PHASES
from bench.procs import BENCH
from bench.redis_tools import BenchRedis
from bench.report import render, summary
from bench.results import Machine, Results


async def run_phases(cfg: RunConfig, skip: set[str]) -> Results:
    """Start the bench Redis, run every phase not skipped in order, stop the Redis. A failed phase is a note."""
    results = Results(cfg)
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url  # for bench.bench_jobs, imported by the phases that need it
    try:
        say(f"Redis {rds.version()} on port {rds.port} (pid {rds.proc.pid if rds.proc else '?'})")
        results.machine = Machine.collect(rds.version())
        for phase in PHASES:
            if phase.name in skip:
                continue
            say(f"phase {phase.name}")
            t0 = time.monotonic()
            try:
                if phase.flushes_redis:
                    rds.flush()
                await phase.run(cfg, rds, results)
            except Exception as e:  # noqa: BLE001  (one phase failing must not lose the others' figures)
                results.notes.append(f"phase {phase.name} failed: {e!r}")
                say(f"  phase {phase.name} FAILED: {e!r}\n{traceback.format_exc()}")
            say(f"  phase {phase.name} took {time.monotonic() - t0:.0f}s")
    finally:
        rds.stop()
    return results


def main() -> None:
    names = [phase.name for phase in PHASES]
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="small counts, < 2 minutes")
    ap.add_argument("--skip", nargs="*", default=[], choices=names, metavar="PHASE", help=" ".join(names))
    ap.add_argument("--out", default=str(BENCH / "results.md"))
    a = ap.parse_args()
    started = time.time()
    cmdline = "python -m bench" + (" --quick" if a.quick else "") + (f" --skip {' '.join(a.skip)}" if a.skip else "")
    results = asyncio.run(run_phases(RunConfig.for_run(a.quick), set(a.skip)))
    goals = judge(results)
    text = render(results, goals, started, cmdline)
    print(summary(results, goals))
    Path(a.out).write_text(text)
    print(f"\nwrote {a.out} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
