"""openai-agents 0.24.0: an `Agent` over `MCPServerStreamableHttp` with its defaults (a 5 s session timeout),
its loop driven by the library's own test model (`agents.testing.ScriptedModel`) playing `scripted.Model`.

Usage: python run_openai_agents.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from scripted import Model, main

LIBRARY = "openai-agents 0.24.0"


def last_output(call: ModelCall) -> str:
    """What the model sees of the last tool result: the function call's output in its input."""
    outputs = [item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    output: Any = outputs[-1]["output"] if outputs else ""
    if isinstance(output, list):  # content items: {"type": "input_text", "text": ...}
        return "\n".join(str(item.get("text", item)) for item in output)
    return str(output)


async def play(url: str, name: str) -> str:
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
    with model.playing():
        async with MCPServerStreamableHttp(params={"url": url}) as server:  # every default, the 5 s timeout too
            agent = Agent(name="jobs", model=scripted, mcp_servers=[server])
            await Runner.run(agent, "run the job", max_turns=60)
    return model.outcome.line()


if __name__ == "__main__":
    set_tracing_disabled(True)  # no trace export (it would need an API key)
    main(play)
