"""The cost of the plain-host fallback on the synchronous path: fallback on and off, interleaved.

A request without the tasks extension that calls an optional tool waits up to the inline window for
its job (`mcp_celery.server.plain.call`, issue 20): it follows progress and questions, which the plain
synchronous path it replaced (`MCP_CELERY_TOOL_FALLBACK=false`) never did. For a job that ends inside
the window the two should cost the same. Two `mcp-celery serve` processes over the bench Redis and one
prefork worker, identical but for MCP_CELERY_TOOL_FALLBACK=false on one, are measured in alternating
c=1 slices of synchronous `tools/call` of a trivial job (as the metrics phase does, so that drift of the
machine hits both sides alike), with a third server (fallback on) as a control.
"""

from __future__ import annotations

from bench.config import RunConfig
from bench.phases.ab import ab_stats, say_ab
from bench.phases.metrics_cost import SIDES, interleaved, on_and_off_servers
from bench.redis_tools import BenchRedis
from bench.results import FallbackCostFigures, Results
from bench.task_ops import sync_op


async def run_fallback(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    with on_and_off_servers(rds, "fallback", {"MCP_CELERY_TOOL_FALLBACK": "false"}) as (_, urls):
        calls = {side: sync_op(urls[side]) for side in SIDES}
        per_round = await interleaved(urls, calls, cfg.ab_rounds, cfg.ab_slice_s)
    figures = results.fallback = FallbackCostFigures(
        sync=ab_stats(per_round["on"], per_round["off"]),
        sync_control=ab_stats(per_round["control"], per_round["on"]),
        rounds=cfg.ab_rounds,
        slice_s=cfg.ab_slice_s,
    )
    say_ab("fallback sync tools/call", ("on", "off"), figures.sync, figures.sync_control)
