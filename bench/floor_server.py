"""The floor: a minimal mcp lowlevel Server on Streamable HTTP (stateless, JSON responses).

tools/call returns a constant CallToolResult; tasks/get is a custom method returning an empty result.
Run: python -m bench.floor_server PORT

With a Redis URL (`python -m bench.floor_server PORT REDIS_URL`) it is the floor of any server
that keeps its tasks in Redis: the same handlers, plus what each must do at the least. tools/call
writes a task-sized record and a message-sized queue entry in one pipelined round trip (a task
must be durable before its id is returned); tasks/get reads one task-sized hash (one HGETALL)
and returns its fields. No MCP task logic, no Celery: what is left between this and mcp-celery
is our own work.
"""

from __future__ import annotations

import sys
import uuid
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


#: Sizes like one of mcp-celery's records (about 1.3 KB in Redis) and one Celery message (about 1.5 KB).
RECORD: dict[Any, Any] = {f"field{i}": "x" * 80 for i in range(14)}
MESSAGE = "m" * 1500
RECORDS = 1000


def record_key(task_id: str) -> str:
    return f"bench-floor:task:{task_id}"


def with_redis(url: str) -> tuple[Any, Any]:
    """tools/call and tasks/get handlers that pay one Redis round trip each."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)

    async def call_tool_stored(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        task_id = uuid.uuid4().hex
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(record_key(task_id), mapping=RECORD)
            pipe.expire(record_key(task_id), 60)
            pipe.lpush("bench-floor:queue", MESSAGE)
            pipe.ltrim("bench-floor:queue", 0, 99)
            await pipe.execute()
        return CONST

    async def tasks_get_stored(ctx: ServerRequestContext[Any], params: TaskIdParams) -> dict[str, Any]:
        raw: dict[Any, Any] = await client.hgetall(record_key(params.task_id))  # type: ignore[misc]
        return {key.decode(): value.decode() for key, value in raw.items()}

    return call_tool_stored, tasks_get_stored


def build(redis_url: str | None = None) -> Server[Any]:
    on_call, on_get = (call_tool, tasks_get) if redis_url is None else with_redis(redis_url)
    s: Server[Any] = Server("bench-floor", version="0", on_call_tool=on_call, on_list_tools=list_tools)
    s.add_request_handler("tasks/get", TaskIdParams, on_get)
    s.extensions["io.modelcontextprotocol/tasks"] = {}
    return s


if __name__ == "__main__":
    port = int(sys.argv[1])
    app = build(sys.argv[2] if len(sys.argv) > 2 else None).streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
