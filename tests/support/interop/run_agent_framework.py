"""agent-framework-core 1.23.0: `MCPStreamableHTTPTool` with its defaults (tool results shown `structured_first`),
its functions (`FunctionTool.invoke`, what the agent's loop calls) driven by `scripted.Model` on the text of
the Content items the model would be given.

Usage: python run_agent_framework.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

from typing import Any

from agent_framework import MCPStreamableHTTPTool
from scripted import Model, main

LIBRARY = "agent-framework-core 1.23.0"


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)
    step: tuple[str, dict[str, Any]] | None = model.first()
    with model.playing():
        async with MCPStreamableHTTPTool(name="jobs", url=url) as tool:
            functions = {function.name: function for function in tool.functions}
            while step is not None:
                contents = await functions[step[0]].invoke(arguments=step[1])
                step = model.next("\n".join(str(content.text) for content in contents))
    return model.outcome.line()


if __name__ == "__main__":
    main(play)
