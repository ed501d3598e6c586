"""Sampling with tools: the requests jobs build, the answers the server accepts, and the client's answerers
(the OpenAI-compatible translation and the command), without a server. End to end: tests/jobs/test_code_review.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
from mcp_types import CreateMessageRequestParams

from mcp_celery.client import CommandSampler
from mcp_celery.client._openai import answer_from_completion, chat_request
from mcp_celery.inputs import (
    SAMPLING_DECLINED,
    SAMPLING_USAGE_META,
    invalid_answer_reason,
    missing_capability,
    sampling,
)

READ_TOOL = {"name": "read", "description": "read a file", "inputSchema": {"type": "object"}}
TOOL_USE = {"type": "tool_use", "id": "t1", "name": "read", "input": {"file": "a.py"}}


def answer(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "model": "m"}


def test_a_request_with_tools_carries_them_and_the_tool_choice() -> None:
    request = sampling("review", 100, tools=[READ_TOOL], tool_choice="none", systemPrompt="be brief")
    assert request["params"] == {
        "messages": [{"role": "user", "content": {"type": "text", "text": "review"}}],
        "maxTokens": 100, "systemPrompt": "be brief", "tools": [READ_TOOL], "toolChoice": {"mode": "none"},
    }  # fmt: skip
    assert "tools" not in sampling("plain")["params"]


def test_tools_need_the_clients_sampling_tools_capability() -> None:
    with_tools = sampling("review", tools=[READ_TOOL])
    assert "sampling.tools" in str(missing_capability(with_tools, {"sampling": {}}))
    assert missing_capability(with_tools, {"sampling": {"tools": {}}}) is None
    assert missing_capability(sampling("plain"), {"sampling": {}}) is None


def test_a_tool_use_answer_is_valid_only_for_a_request_that_offered_that_tool() -> None:
    with_tools, plain = sampling("review", tools=[READ_TOOL]), sampling("plain")
    assert invalid_answer_reason(with_tools, answer([TOOL_USE])) is None
    assert invalid_answer_reason(with_tools, answer({"type": "text", "text": "done"})) is None
    assert "not a CreateMessageResult" in str(invalid_answer_reason(plain, answer([TOOL_USE])))
    unknown = answer([{**TOOL_USE, "name": "delete_everything"}])
    assert "did not offer" in str(invalid_answer_reason(with_tools, unknown))
    assert "not a CreateMessageResultWithTools" in str(
        invalid_answer_reason(with_tools, answer([{"type": "tool_use"}]))
    )


def test_sampling_becomes_a_chat_completions_request() -> None:
    params = {
        "systemPrompt": "You review code.",
        "maxTokens": 300,
        "temperature": 0.2,
        "stopSequences": ["END"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image", "data": "AAAA", "mimeType": "image/png"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "reading"}, TOOL_USE]},
            {"role": "user", "content": [{"type": "tool_result", "toolUseId": "t1", "isError": True,
                                          "content": [{"type": "text", "text": "no such file"}]}]},
        ],
        "tools": [READ_TOOL],
        "toolChoice": {"mode": "required"},
    }  # fmt: skip
    body = chat_request(params, "qwen")
    assert body["messages"] == [
        {"role": "system", "content": "You review code."},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "reading", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "read", "arguments": '{"file": "a.py"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "error: no such file"},
    ]  # fmt: skip
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "read", "description": "read a file", "parameters": {"type": "object"}},
        }
    ]
    assert (body["model"], body["max_tokens"], body["temperature"], body["stop"], body["tool_choice"]) == (
        "qwen", 300, 0.2, ["END"], "required",
    )  # fmt: skip


def test_a_chat_completion_becomes_a_sampling_answer() -> None:
    calls = {"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"file": "b.py"}'}},
        {"type": "function", "function": {"name": "read", "arguments": "not json"}},
    ]}}], "usage": {"prompt_tokens": 50, "completion_tokens": 7}}  # fmt: skip
    converted = answer_from_completion(calls, "qwen", tools=True)
    first, second = converted["content"]
    assert (converted["stopReason"], converted["model"]) == ("toolUse", "qwen")
    assert first == {"type": "tool_use", "id": "c1", "name": "read", "input": {"file": "b.py"}}
    assert second["id"].startswith("call-") and second["input"] == {"arguments": "not json"}
    assert converted["_meta"] == {SAMPLING_USAGE_META: {"inputTokens": 50, "outputTokens": 7}}
    assert invalid_answer_reason(sampling("x", tools=[READ_TOOL]), converted) is None
    text = {"model": "served-name", "choices": [{"finish_reason": "length", "message": {"content": "partial"}}]}
    plain = answer_from_completion(text, "qwen", tools=False)
    assert plain == {"role": "assistant", "model": "served-name", "stopReason": "maxTokens",
                     "content": {"type": "text", "text": "partial"}}  # fmt: skip


def run_command(command: list[str], params: dict[str, Any], timeout: float = 30) -> Any:
    sampler = CommandSampler(command, timeout=timeout)
    request = CreateMessageRequestParams.model_validate(params)

    async def ask() -> Any:
        return await sampler(None, request)  # type: ignore[arg-type]  (the context is not used)

    return anyio.run(ask)


def test_a_command_gets_the_request_on_stdin_and_its_stdout_is_the_answer() -> None:
    echo = (
        "import json, sys; r = json.load(sys.stdin); tool = r['params']['tools'][0]['name']; "
        "print(json.dumps({'role': 'assistant', 'model': r['method'], "
        "'content': [{'type': 'tool_use', 'id': '1', 'name': tool, 'input': {}}]}))"
    )
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5,
              "tools": [READ_TOOL]}  # fmt: skip
    result = run_command([sys.executable, "-c", echo], params)
    assert result.model == "sampling/createMessage" and result.content[0].name == "read"


def test_a_command_that_fails_or_hangs_gives_a_declined_answer() -> None:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
    for command, reason in [
        ([sys.executable, "-c", "import sys; sys.exit('no model here')"], "exited with status 1: no model here"),
        ([sys.executable, "-c", "print('not json')"], "not a sampling result"),
        ([sys.executable, "-c", "print(json.dumps({}))"], "exited with status 1"),  # NameError: json
        (["/nonexistent/model"], "could not run"),
    ]:
        result = run_command(command, params)
        assert result.stop_reason == SAMPLING_DECLINED and reason in result.content.text, result
    slow = run_command([sys.executable, "-c", "import time; time.sleep(30)"], params, timeout=0.5)
    assert slow.stop_reason == SAMPLING_DECLINED and "within 0.5 s" in slow.content.text
    assert json.loads(json.dumps(slow.model_dump(by_alias=True)))["stopReason"] == "declined"
