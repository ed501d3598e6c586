"""The cost of an idempotency key on `tools/call`: calls with a fresh key and without one, interleaved.

A call with a key claims it in Redis (`mcp_celery.server.engine.repeats`, issue 47): on one Redis server
in the same script that writes the task's record, so no round trip more. One `mcp-celery serve` over the
bench Redis, its prefork worker paused (so that no job shares the slices), is measured in alternating c=1
slices of `tools/call` to the task handle with a fresh `Idempotency-Key` header per call and without one;
a second side without a key is the control (how far two identical sides differ in the same slices). All
sides call the same server process, so the figure is the key's cost and nothing else.
"""

from __future__ import annotations

from bench.config import RunConfig
from bench.phases.ab import ab_stats, say_ab
from bench.phases.metrics_cost import interleaved, servers_and_worker
from bench.procs import paused
from bench.redis_tools import BenchRedis
from bench.results import IdempotencyCostFigures, Results
from bench.task_ops import create_op, keyed_create_op

SIDES = ("keyed", "none", "control")


async def run_idempotency(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    with servers_and_worker(rds, "idempotency", {"one": {}}) as (worker, urls), paused(worker):
        url = urls["one"]
        ops = {"keyed": keyed_create_op(url), "none": create_op(url), "control": create_op(url)}
        per_round = await interleaved(dict.fromkeys(SIDES, url), ops, cfg.ab_rounds, cfg.ab_slice_s)
    figures = results.idempotency = IdempotencyCostFigures(
        keyed=ab_stats(per_round["keyed"], per_round["none"]),
        control=ab_stats(per_round["control"], per_round["none"]),
        rounds=cfg.ab_rounds,
        slice_s=cfg.ab_slice_s,
    )
    say_ab("idempotency tools/call", ("with a key", "without"), figures.keyed, figures.control)
