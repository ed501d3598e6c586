"""A second, independent SEP-2663 server for the client tests: FastMCP 4.1.4 + fastmcp-tasks 4.1.4.

Runs in bench/.venv-fastmcp (its packages exclude this project's redis-py); Docket lives in this process
on the given Redis. Streamable HTTP, stateless, JSON responses, like bench/fastmcp_server.py.

Run: bench/.venv-fastmcp/bin/python tests/support/fastmcp_server.py PORT REDIS_URL
"""

from __future__ import annotations

import asyncio
import sys

from fastmcp import Context, FastMCP
from fastmcp_tasks import TasksExtension


def build(redis_url: str, docket_name: str) -> FastMCP:
    mcp = FastMCP("client-tests-fastmcp")
    mcp.add_extension(TasksExtension(url=redis_url, name=docket_name))

    @mcp.tool(task=True)
    async def add(a: int, b: int) -> int:
        return a + b

    @mcp.tool(task=True)
    async def slow(ctx: Context, seconds: float) -> str:
        for i in range(int(seconds * 10)):
            await ctx.report_progress(i, seconds * 10, f"tick {i}")
            await asyncio.sleep(0.1)
        return "slow done"

    return mcp


if __name__ == "__main__":
    port, redis_url = int(sys.argv[1]), sys.argv[2]
    # A Docket name per server: two servers on one Redis must not run each other's tasks.
    build(redis_url, f"client-tests-fastmcp-{port}").run(
        "http", host="127.0.0.1", port=port, path="/mcp", stateless_http=True, json_response=True,
        log_level="warning", show_banner=False,
    )  # fmt: skip
