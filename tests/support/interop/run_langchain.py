"""langchain-mcp-adapters 0.3.2 (mcp 1.x: the 2025-11-25 `initialize` handshake over streamable HTTP):
`MultiServerMCPClient.get_tools()` LangChain tools, each invoked as an agent's tool node invokes it
(`ainvoke` with a tool call), driven by `scripted.Model` on the content of the ToolMessage the model gets.

Usage: python run_langchain.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient
from scripted import Model, main

LIBRARY = "langchain-mcp-adapters 0.3.2"


def text_of(content: Any) -> str:
    """The ToolMessage's content as the model reads it: a string, or text blocks."""
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") if isinstance(block, dict) else str(block) for block in content)


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)
    client = MultiServerMCPClient({"jobs": {"url": url, "transport": "streamable_http"}})
    step: tuple[str, dict[str, Any]] | None = model.first()
    with model.playing():
        tools = {tool.name: tool for tool in await client.get_tools()}
        calls = 0
        while step is not None:
            calls += 1
            call = {"name": step[0], "args": step[1], "id": f"call-{calls}", "type": "tool_call"}
            message = await tools[step[0]].ainvoke(call)
            step = model.next(text_of(message.content))
    return model.outcome.line()


if __name__ == "__main__":
    main(play)
