"""The cost of an idempotency key on `tools/call`: calls with a fresh key and without one, interleaved.

A call with a key claims it in Redis before its task's record is written (`mcp_celery.server.engine.repeats`,
issue 47): one more round trip, a one-key Lua script. One `mcp-celery serve` over the bench Redis, its prefork
worker paused (so that no job shares the slices), is measured in alternating c=1 slices of `tools/call` to the
task handle with a fresh `Idempotency-Key` header per call and without one; a second side without a key is the
control (how far two identical sides differ in the same slices). Both sides hit the same server process, so
the figure is the key's cost and nothing else.
"""

from __future__ import annotations

from bench.config import RunConfig, say
from bench.phases.ab import ab_stats
from bench.phases.metrics_cost import interleaved
from bench.procs import paused, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from bench.results import IdempotencyCostFigures, Results
from bench.task_ops import create_op, keyed_create_op

SIDES = ("keyed", "none", "control")


async def run_idempotency(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which the entry point sets

    worker = start_worker(rds.url, "worker-idempotency")
    server = None
    try:
        server, url = start_ours_server(rds.url, "idempotency-server")
        wait_worker(bench_jobs.app, worker)
        ops = {"keyed": keyed_create_op(url), "none": create_op(url), "control": create_op(url)}
        with paused(worker):
            per_round = await interleaved(dict.fromkeys(SIDES, url), ops, cfg.ab_rounds, cfg.ab_slice_s)
    finally:
        if server is not None:
            server.stop()
        worker.stop(timeout=15)
    figures = results.idempotency = IdempotencyCostFigures(
        keyed=ab_stats(per_round["keyed"], per_round["none"]),
        control=ab_stats(per_round["control"], per_round["none"]),
        rounds=cfg.ab_rounds,
        slice_s=cfg.ab_slice_s,
    )
    ab, aa = figures.keyed, figures.control
    say(
        f"  idempotency tools/call: with a key p50 {ab.big_p50_ms:.3f} ms (n={ab.big_samples}), without "
        f"{ab.small_p50_ms:.3f} ms (n={ab.small_samples}); with/without {ab.ratio:.3f} (95% CI {ab.ci_low:.3f}-"
        f"{ab.ci_high:.3f}); control {aa.ratio:.3f} (95% CI {aa.ci_low:.3f}-{aa.ci_high:.3f})"
    )
