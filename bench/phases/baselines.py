"""The ceiling and floor phases: what the load client and a bare MCP server can do on this machine.

ceiling: the load client against a raw ASGI app returning a fixed body (`bench/ceiling_server.py`).
floor: a minimal mcp lowlevel `Server` (`bench/floor_server.py`): constant tools/call, empty tasks/get.
"""

from __future__ import annotations

from bench import rpc
from bench.config import RunConfig
from bench.load import LoadResult, Op, run_load
from bench.procs import PY, start_http_server
from bench.redis_tools import BenchRedis
from bench.results import Results
from bench.task_ops import get_op
from mcp_celery._processes import free_port


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
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = start_http_server("floor", [PY, "-m", "bench.floor_server", str(port)], url)
    figures = results.floor
    ids = [f"t{i:032d}" for i in range(1000)]  # the floor answers any id
    try:
        figures.call_c1 = results.window("floor.call.c1", await window(cfg, call_noop(url), 1))
        figures.call_c16 = results.window("floor.call.c16", await window(cfg, call_noop(url), 16))
        figures.get_c1 = results.window("floor.get.c1", await window(cfg, get_op(url, ids), 1))
        figures.get_c16 = results.window("floor.get.c16", await window(cfg, get_op(url, ids), 16))
    finally:
        server.stop()
