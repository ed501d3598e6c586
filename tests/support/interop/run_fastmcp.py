"""fastmcp 4.1.6: `fastmcp.Client` (no tasks extension), its `call_tool` being the tool object an agent calls,
with an elicitation handler as an application gives it; the model is shown each result's text content.

Usage: python run_fastmcp.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

from typing import Any

from fastmcp import Client
from fastmcp.exceptions import ToolError
from scripted import Model, main, text_of

LIBRARY = "fastmcp 4.1.6"


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)

    async def elicit(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
        return model.elicited()

    step: tuple[str, dict[str, Any]] | None = model.first()
    with model.playing():
        async with Client(url, elicitation_handler=elicit) as client:
            while step is not None:
                try:
                    seen = text_of((await client.call_tool(step[0], step[1])).content)
                except ToolError as exc:  # a tool error is shown to the model as its text
                    seen = str(exc)
                step = model.next(seen)
    return model.outcome.line()


if __name__ == "__main__":
    main(play)
