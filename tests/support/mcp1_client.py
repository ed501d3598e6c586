"""A client on the mcp 1.x SDK (initialize-era sessions) against mcp-celery, without the tasks extension.

Runs in its own virtualenv (tests/support/.venv-mcp1, made by tests/server/plain/test_plain_clients.py): mcp 1.x
cannot share this project's environment. Imports nothing of this project. Prints one JSON object with what it saw.

    python tests/support/mcp1_client.py stdio PYTHON ROOT
        (runs `PYTHON -m mcp_celery serve -A tests.support.sample_jobs`)
    python tests/support/mcp1_client.py http URL
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.context import RequestContext

TERMINAL = {"completed", "failed", "cancelled"}


def text(result: types.CallToolResult) -> str:
    block = result.content[-1]
    return block.text if isinstance(block, types.TextContent) else repr(block)


async def follow(session: ClientSession, task_id: str) -> types.CallToolResult:
    """task_status with waits until the task ends."""
    with anyio.fail_after(60):
        while True:
            result = await session.call_tool("task_status", {"task_id": task_id, "wait_seconds": 3})
            if (result.structuredContent or {}).get("status") in TERMINAL:
                return result


async def scenario(session: ClientSession, asked: list[str], transport: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"transport": transport}
    init = await session.initialize()
    seen["protocolVersion"] = init.protocolVersion
    seen["tools"] = sorted(tool.name for tool in (await session.list_tools()).tools)

    progress: list[list[Any]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append([value, total, message])

    done = await session.call_tool("legacy_progress", {"steps": 15}, progress_callback=on_progress)
    seen["progress"], seen["progress_result"] = progress, text(done)

    # Past the window: a handle for a tool with an output schema (this SDK validates structuredContent).
    running = await session.call_tool("slow_greeting", {"name": "Ada", "seconds": 4.5})
    handle = (running.meta or {})["mcp-celery/task"]
    seen["handle"], seen["handle_structured"] = handle, running.structuredContent
    final = await follow(session, handle["taskId"])
    seen["final"] = (final.structuredContent or {})["result"]["structuredContent"]

    # A question: asked on the session where it can be (stdio), else answered with task_respond.
    answer = await session.call_tool("confirm_echo", {"text": transport})
    pending = (answer.meta or {}).get("mcp-celery/task")
    if pending is not None:
        seen["question_handle"] = pending
        reply = {"elicit-1": {"action": "accept", "content": {"confirm": True}}}
        await session.call_tool("task_respond", {"task_id": pending["taskId"], "responses": reply})
        answer = await follow(session, pending["taskId"])
    seen["question"], seen["asked_on_session"] = text(answer), asked
    return seen


async def main() -> None:
    transport = sys.argv[1]
    asked: list[str] = []

    async def elicit(
        context: RequestContext[ClientSession, Any], params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    if transport == "stdio":
        python, root = sys.argv[2], sys.argv[3]
        server = StdioServerParameters(
            command=python,
            args=["-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"],
            cwd=root,
            env=dict(os.environ),
        )
        async with stdio_client(server) as (read, write), ClientSession(read, write, elicitation_callback=elicit) as s:
            seen = await scenario(s, asked, transport)
    else:
        async with (
            streamablehttp_client(sys.argv[2]) as (read, write, _),
            ClientSession(read, write, elicitation_callback=elicit) as s,
        ):
            seen = await scenario(s, asked, transport)
    print(json.dumps(seen))


if __name__ == "__main__":
    anyio.run(main)
