"""The floor: a minimal mcp lowlevel Server on Streamable HTTP (stateless, JSON responses).

tools/call returns a constant CallToolResult; tasks/get is a custom method returning an empty result.
Run: python -m bench.floor_server PORT
"""

from __future__ import annotations

import sys
from typing import Any

import mcp.types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

CONST = types.CallToolResult(content=[types.TextContent(type="text", text="0")])


class TaskIdParams(types.RequestParams):
    task_id: str


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    return CONST


async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name="noop", input_schema={"type": "object"})])


async def tasks_get(ctx: ServerRequestContext[Any], params: TaskIdParams) -> dict[str, Any]:
    return {}


def build() -> Server[Any]:
    s: Server[Any] = Server("bench-floor", version="0", on_call_tool=call_tool, on_list_tools=list_tools)
    s.add_request_handler("tasks/get", TaskIdParams, tasks_get)
    s.extensions["io.modelcontextprotocol/tasks"] = {}
    return s


if __name__ == "__main__":
    port = int(sys.argv[1])
    app = build().streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
