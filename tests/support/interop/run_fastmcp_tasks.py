"""fastmcp 4.1.4 with fastmcp-tasks 4.1.4 (SEP-2663): `fastmcp.Client.call_tool` runs each call as a task and
answers its questions through the client's elicitation handler; the cancel case takes the library's explicit
handle (`call_tool_task`) and its `cancel()`.

Usage: python run_fastmcp_tasks.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastmcp import Client
from fastmcp_tasks.client import call_tool_task
from scripted import Model, main, text_of

LIBRARY = "fastmcp 4.1.4 + fastmcp-tasks 4.1.4"
#: How long the cancel case's job runs before the library's handle cancels it.
CANCEL_AFTER_S = 2.0


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)

    async def elicit(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
        return model.elicited()

    tool, arguments = model.first()
    with model.playing():
        async with Client(url, elicitation_handler=elicit) as client:
            if model.wants_cancel():
                task = await call_tool_task(client, tool, arguments)
                await asyncio.sleep(CANCEL_AFTER_S)
                await task.cancel()
                final = await task.wait()
                model.next(f"task {task.task_id} {final.status}")
            else:
                model.next(text_of((await client.call_tool(tool, arguments)).content))
    return model.outcome.line()


if __name__ == "__main__":
    main(play)
