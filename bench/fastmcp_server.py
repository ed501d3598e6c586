"""FastMCP 4.1.4 + fastmcp-tasks 4.1.4 baseline: the same trivial `noop` as a task-optional tool.

Runs in its own virtualenv (bench/.venv-fastmcp); Docket (backend + worker) lives in this server process
on the bench Redis. Served on Streamable HTTP, stateless, JSON responses.

Run: bench/.venv-fastmcp/bin/python bench/fastmcp_server.py PORT REDIS_URL
"""

from __future__ import annotations

import sys

from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension


def build(redis_url: str) -> FastMCP:
    mcp = FastMCP("bench-fastmcp")
    mcp.add_extension(TasksExtension(url=redis_url, name="bench-fastmcp"))

    @mcp.tool(task=True)  # TaskConfig(mode="optional"): task when the client declares the extension
    async def noop(x: int = 0) -> int:
        return x

    return mcp


if __name__ == "__main__":
    port, redis_url = int(sys.argv[1]), sys.argv[2]
    build(redis_url).run(
        "http",
        host="127.0.0.1",
        port=port,
        path="/mcp",
        stateless_http=True,
        json_response=True,
        log_level="warning",
        show_banner=False,
    )
