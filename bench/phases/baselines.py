"""The ceiling and floor phases: what the load client and a bare MCP server can do on this machine.

ceiling: the load client against a raw ASGI app returning a fixed body (`bench/ceiling_server.py`).
floor: a minimal mcp lowlevel `Server` (`bench/floor_server.py`): constant tools/call, empty tasks/get;
then the same with one Redis round trip per request (a task-sized write, a task-sized read): the
floor of any server that keeps its tasks in Redis.
"""

from __future__ import annotations

import redis

from bench import rpc
from bench.config import RunConfig
from bench.floor_server import RECORD, RECORDS, record_key
from bench.load import LoadResult, Op, run_load
from bench.procs import PY, start_http_server
from bench.redis_tools import BenchRedis
from bench.results import FloorFigures, Results
from bench.task_ops import get_op
from mcp_celery.testing.processes import free_port


def call_noop(url: str) -> Op:
    """tools/call `noop` whatever the answer (the baselines answer synchronously)."""
    return lambda c, i: rpc.call_tool(c, url, "noop", {"x": i})


async def window(cfg: RunConfig, op: Op, concurrency: int) -> LoadResult:
    return await run_load(op, concurrency, duration=cfg.window_s, warmup=cfg.warmup_s)


async def run_ceiling(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = start_http_server("ceiling", [PY, "-m", "bench.ceiling_server", str(port)], url)
    figures = results.ceiling
    try:
        figures.c1 = results.window("ceiling.c1", await window(cfg, call_noop(url), 1))
        figures.c16 = results.window("ceiling.c16", await window(cfg, call_noop(url), 16))
    finally:
        server.stop()


async def run_floor(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    await _floor(cfg, results, results.floor, "floor", [])
    records = redis.Redis.from_url(rds.url)
    ids = [f"t{i:032d}" for i in range(RECORDS)]
    with records.pipeline(transaction=False) as pipe:
        for task_id in ids:
            pipe.hset(record_key(task_id), mapping=RECORD)
        pipe.execute()
    try:
        await _floor(cfg, results, results.floor_redis, "floor+redis", [rds.url])
    finally:
        records.delete(*(record_key(task_id) for task_id in ids), "bench-floor:queue")
        records.close()


async def _floor(cfg: RunConfig, results: Results, figures: FloorFigures, name: str, extra: list[str]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = start_http_server(name, [PY, "-m", "bench.floor_server", str(port), *extra], url)
    ids = [f"t{i:032d}" for i in range(RECORDS)]  # the plain floor answers any id; with Redis, these exist
    try:
        figures.call_c1 = results.window(f"{name}.call.c1", await window(cfg, call_noop(url), 1))
        figures.call_c16 = results.window(f"{name}.call.c16", await window(cfg, call_noop(url), 16))
        figures.get_c1 = results.window(f"{name}.get.c1", await window(cfg, get_op(url, ids), 1))
        figures.get_c16 = results.window(f"{name}.get.c16", await window(cfg, get_op(url, ids), 16))
    finally:
        server.stop()
