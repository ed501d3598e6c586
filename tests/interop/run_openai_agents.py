"""openai-agents 0.24.0: an `Agent` over `MCPServerStreamableHttp` with its defaults (a 5 s session timeout),
its loop driven by the library's own test model (`agents.testing.ScriptedModel`) playing `scripted.Model`.

Usage: python run_openai_agents.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from scripted import Model

LIBRARY = "openai-agents 0.24.0"


def last_output(call: ModelCall) -> str:
    """What the model sees of the last tool result: the function call's output in its input."""
    outputs = [item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    output: Any = outputs[-1]["output"] if outputs else ""
    if isinstance(output, list):  # content items: {"type": "input_text", "text": ...}
        return "\n".join(str(item.get("text", item)) for item in output)
    return str(output)


async def play(server: MCPServerStreamableHttp, name: str) -> str:
    model = Model(LIBRARY, name)
    calls = 0

    def respond(call: ModelCall) -> Any:
        nonlocal calls
        calls += 1
        step = model.first() if calls == 1 else model.next(last_output(call))
        if step is None:
            return [assistant_message(model.outcome.final)]
        return [function_call(step[0], step[1], call_id=f"call-{calls}")]

    scripted = ScriptedModel([ModelStep.respond(respond) for _ in range(60)])
    agent = Agent(name="jobs", model=scripted, mcp_servers=[server])
    try:
        await Runner.run(agent, "run the job", max_turns=60)
    except Exception as exc:  # noqa: BLE001 - reported as the case's error
        model.finish(model.outcome.final, f"{type(exc).__name__}: {exc}")
    return model.outcome.line()


async def main(url: str, names: list[str]) -> None:
    set_tracing_disabled(True)  # no trace export (it would need an API key)
    async with MCPServerStreamableHttp(params={"url": url}) as server:  # every default, the 5 s timeout too
        for name in names:
            print(await play(server, name), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
