"""The chaos test (issue 11): tasks in flight through kills, restarts, cancels and answers at random.

`tests/e2e/test_chaos.py` runs a short version in the normal pytest run; `python -m tests.support.chaos
--minutes 10` runs the long one (200 tasks in flight) by hand. Both print the seed and a
summary table; `--seed` replays a run's decisions (process timing still varies).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.support.chaos.cluster import Cluster
from tests.support.chaos.report import Verdict, evaluate
from tests.support.chaos.run import Chaos, Plan

__all__ = ["Plan", "Verdict", "run_chaos"]


def run_chaos(folder: Path, plan: Plan, seed: int | None = None, settle_s: float | None = None) -> Verdict:
    """Start the cluster in `folder`, run `plan`, bring everything back, wait for the tasks to end, judge."""
    seed = random.randrange(1_000_000) if seed is None else seed
    print(f"chaos seed {seed} (replay: --seed {seed}); logs in {folder}", flush=True)
    cluster = Cluster(folder, concurrency=plan.concurrency)
    began = time.monotonic()
    cluster.start()
    try:
        chaos = Chaos(cluster, plan, seed)
        chaos.phases["start"] = chaos.started - began
        chaos.run()
        chaos.settle(settle_s if settle_s is not None else 60 + plan.in_flight * 0.3)
        verdict = evaluate(chaos)
    finally:
        cluster.close()
    print(verdict.table, flush=True)
    for line in verdict.problems:
        print("PROBLEM", line, flush=True)
    for line in verdict.stuck:
        print("STUCK", line, flush=True)
    return verdict
