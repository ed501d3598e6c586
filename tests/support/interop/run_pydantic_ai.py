"""pydantic-ai 2.68: an `Agent` with an `MCPToolset` (its defaults: no elicitation handler), its loop driven by
the library's own `FunctionModel` playing `scripted.Model` on what pydantic-ai sends the model of each tool
result (`ToolReturnPart.model_response_str()`: the structuredContent as JSON when every block is text).

Usage: python run_pydantic_ai.py URL CASE... (one JSON line per case on stdout)
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from scripted import Model, main

LIBRARY = "pydantic-ai 2.68"


def last_seen(messages: list[ModelMessage]) -> str | None:
    """What the model is shown of the last tool result (None before the first call)."""
    request = messages[-1]
    parts = request.parts if isinstance(request, ModelRequest) else []
    returns = [part for part in parts if isinstance(part, ToolReturnPart)]
    return returns[-1].model_response_str() if returns else None


async def play(url: str, name: str) -> str:
    model = Model(LIBRARY, name)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen = last_seen(messages)
        step = model.first() if seen is None else model.next(seen)
        if step is None:
            return ModelResponse(parts=[TextPart(model.outcome.final)])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1])])

    agent = Agent(FunctionModel(respond), toolsets=[MCPToolset(url)])
    with model.playing():
        async with agent:
            await agent.run("run the job")
    return model.outcome.line()


if __name__ == "__main__":
    main(play)
