"""agent-framework-core 1.23.0: `MCPStreamableHTTPTool` with its defaults (tool results shown `structured_first`),
its functions (`FunctionTool.invoke`, what the agent's loop calls) driven by `scripted.Model` on the text of
the Content items the model would be given.

Usage: python run_agent_framework.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agent_framework import MCPStreamableHTTPTool
from scripted import Model

LIBRARY = "agent-framework-core 1.23.0"


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)
    step: tuple[str, dict[str, Any]] | None = model.first()
    try:
        async with MCPStreamableHTTPTool(name="jobs", url=url) as tool:
            functions = {function.name: function for function in tool.functions}
            while step is not None:
                contents = await functions[step[0]].invoke(arguments=step[1])
                step = model.next("\n".join(str(content.text) for content in contents))
    except Exception as exc:  # noqa: BLE001 - reported as the case's error
        model.finish(model.outcome.final, f"{type(exc).__name__}: {exc}")
    return model.outcome.line()


async def main(url: str, names: list[str]) -> None:
    for name in names:
        print(await play(url, name), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
