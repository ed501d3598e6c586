"""The phases of one run, in the order they run.

Each phase is `async run(cfg, redis, results)`: it starts what it measures, writes its figures into its
own part of `results`, and stops everything it started, also when it fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.config import RunConfig
from bench.phases.baselines import run_ceiling, run_floor
from bench.phases.cancel import run_cancel
from bench.phases.fallback_cost import run_fallback
from bench.phases.idempotency_cost import run_idempotency
from bench.phases.metrics_cost import run_metrics
from bench.phases.raw import run_raw
from bench.phases.servers import run_fastmcp, run_ours
from bench.redis_tools import BenchRedis
from bench.results import Results

__all__ = ["PHASES", "Phase"]


@dataclass(frozen=True)
class Phase:
    name: str
    run: Callable[[RunConfig, BenchRedis, Results], Awaitable[None]]
    flushes_redis: bool  # starts from an empty bench Redis


PHASES = (
    Phase("ceiling", run_ceiling, flushes_redis=False),
    Phase("floor", run_floor, flushes_redis=False),
    Phase("raw", run_raw, flushes_redis=True),
    Phase("ours", run_ours, flushes_redis=True),
    Phase("metrics", run_metrics, flushes_redis=True),
    Phase("fallback", run_fallback, flushes_redis=True),
    Phase("idempotency", run_idempotency, flushes_redis=True),
    Phase("fastmcp", run_fastmcp, flushes_redis=True),
    Phase("cancel", run_cancel, flushes_redis=True),
)
