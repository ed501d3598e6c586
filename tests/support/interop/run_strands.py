"""strands-agents 1.62.0: `MCPClient` over streamable HTTP, plain or with its tasks mode (`tasks_config={}`:
SEP-2663), its agent tools (`MCPAgentTool.stream`, what the agent's loop calls) driven by `scripted.Model` on
the text blocks of each tool result; an elicitation callback answers what reaches the library.

Usage: python run_strands.py URL plain|tasks CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from mcp import types
from mcp.client.streamable_http import streamable_http_client
from scripted import Model, main
from strands.tools.mcp import MCPClient

#: How long a job runs before the cancel case's agent is cancelled (tasks mode: the library cancels its task).
CANCEL_AFTER_S = 3.0


def library(mode: str) -> str:
    return "strands-agents 1.62.0" + (" (tasks mode)" if mode == "tasks" else "")


async def call(client: MCPClient, tool: Any, arguments: dict[str, Any], cancel: threading.Event) -> str:
    """One call through the agent's tool object; the text blocks of its result."""
    use = {"toolUseId": f"use-{id(arguments)}", "name": tool.tool_name, "input": arguments}
    state = {"agent": type("AgentStub", (), {"_cancel_signal": cancel})()}
    result: Any = None
    async for event in tool.stream(use, state):
        result = event
    tool_result = result.tool_result if hasattr(result, "tool_result") else result["tool_result"]
    return "\n".join(block.get("text", "") for block in tool_result["content"])


async def play(url: str, mode: str, name: str) -> str:
    model = Model(library(mode), name)

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content=model.elicited())

    options: dict[str, Any] = {"elicitation_callback": elicit}
    if mode == "tasks":
        options["tasks_config"] = {}
    client = MCPClient(lambda: streamable_http_client(url), **options)
    step: tuple[str, dict[str, Any]] | None = model.first()
    with model.playing():
        with client:
            tools = {tool.tool_name: tool for tool in client.list_tools_sync()}
            while step is not None:
                cancel = threading.Event()
                if mode == "tasks" and model.wants_cancel():
                    asyncio.get_running_loop().call_later(CANCEL_AFTER_S, cancel.set)
                step = model.next(await call(client, tools[step[0]], step[1], cancel))
    return model.outcome.line()


if __name__ == "__main__":
    main(play, options=1)
