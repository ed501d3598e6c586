"""Answering `sampling/createMessage` with an OpenAI-compatible chat-completions endpoint.

Ollama, vLLM, llama.cpp's server and most hosted APIs serve `POST {base}/chat/completions`, so this
is how a local model (Qwen, Llama, ...) answers a job's sampling requests. The translation:

    MCP sampling                          chat completions
    systemPrompt                          a first "system" message
    text / image / audio content          content parts (text, image_url data URL, input_audio)
    assistant tool_use blocks             the assistant message's tool_calls (arguments as JSON text)
    user tool_result blocks               one "tool" message each, by tool_call_id, before the user's text
    tools, toolChoice.mode                tools (type function, parameters = inputSchema), tool_choice
    maxTokens, temperature, stopSequences max_tokens, temperature, stop
    answer: tool_calls / finish_reason    tool_use blocks / stopReason (stop→endTurn, length→maxTokens,
                                          tool_calls→toolUse)
    usage                                 _meta["mcp-celery/usage"] = {inputTokens, outputTokens}

Connection errors, 429 and 5xx answers are tried again (twice, 1 s then 2 s later); what still
fails is a declined answer (see `mcp_celery.client._sampling`).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

import anyio
import httpx2
import pydantic
from mcp.client import ClientRequestContext
from mcp_types import CreateMessageRequestParams

from mcp_celery.client._sampling import DEFAULT_TIMEOUT_S, SamplingAnswer, declined, parse_answer, request_json
from mcp_celery.inputs import SAMPLING_USAGE_META

__all__ = ["API_KEY_ENV", "OpenAISampler", "answer_from_completion", "chat_request"]

logger = logging.getLogger(__name__)

API_KEY_ENV = "MCP_CELERY_SAMPLING_API_KEY"
RETRY_DELAYS_S = (1.0, 2.0)
_STOP_REASONS = {"stop": "endTurn", "length": "maxTokens", "tool_calls": "toolUse", "function_call": "toolUse"}


class OpenAISampler:
    """Answers sampling requests with the chat-completions endpoint at `url`.

    Args:
        url: the API base (`http://127.0.0.1:11434/v1` for Ollama) or the full `.../chat/completions` URL.
        model: the model to ask, as the server names it (`qwen2.5-coder:7b`).
        api_key: sent as a bearer token; default `$MCP_CELERY_SAMPLING_API_KEY`, none when unset.
        timeout: seconds one completion may take.
    """

    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the sampling URL {url!r} is not an http(s) URL")
        if not model:
            raise ValueError("an OpenAI-compatible endpoint needs a model name (--sampling-model)")
        base = url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else f"{base}/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.timeout = timeout

    async def __call__(self, context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingAnswer:
        request = request_json(params)["params"]
        body = chat_request(request, self.model)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout, connect=10.0)) as http:
            for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
                try:
                    response = await http.post(self.url, json=body, headers=headers)
                except httpx2.TransportError as exc:
                    failure = f"{self.url} cannot be reached: {type(exc).__name__}: {exc}"
                else:
                    if response.status_code < 400:
                        return self._answer(request, response)
                    failure = f"{self.url} answered HTTP {response.status_code}: {response.text[:300]}"
                    if response.status_code != 429 and response.status_code < 500:
                        break  # a request the server will never take: trying again cannot help
                if delay is None:
                    break
                logger.info("sampling attempt %d failed (%s); trying again in %g s", attempt + 1, failure, delay)
                await anyio.sleep(delay)
        return declined(failure)

    def _answer(self, request: dict[str, Any], response: httpx2.Response) -> SamplingAnswer:
        try:
            return parse_answer(
                request, answer_from_completion(response.json(), self.model, bool(request.get("tools")))
            )
        except (ValueError, KeyError, IndexError, TypeError, pydantic.ValidationError) as exc:
            return declined(f"{self.url} answered something that is not a chat completion: {exc}")


def chat_request(params: dict[str, Any], model: str) -> dict[str, Any]:
    """The chat-completions request body for MCP sampling `params` (camelCase JSON)."""
    messages: list[dict[str, Any]] = []
    if params.get("systemPrompt"):
        messages.append({"role": "system", "content": params["systemPrompt"]})
    for message in params.get("messages") or []:
        messages += _messages(message)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": params.get("maxTokens"),
        "stream": False,
    }
    if params.get("temperature") is not None:
        body["temperature"] = params["temperature"]
    if params.get("stopSequences"):
        body["stop"] = params["stopSequences"]
    if params.get("tools"):
        body["tools"] = [
            {"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                              "parameters": tool.get("inputSchema") or {"type": "object"}}}
            for tool in params["tools"]
        ]  # fmt: skip
        mode = (params.get("toolChoice") or {}).get("mode")
        if mode:
            body["tool_choice"] = mode
    return body


def _messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One MCP sampling message as chat messages: tool results become "tool" messages of their own."""
    blocks = message["content"] if isinstance(message["content"], list) else [message["content"]]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": block["toolUseId"], "content": _tool_result_text(block)}
        for block in blocks
        if block["type"] == "tool_result"
    ]
    parts = [_part(block) for block in blocks if block["type"] in ("text", "image", "audio")]
    calls = [
        {"id": block["id"], "type": "function",
         "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}}
        for block in blocks
        if block["type"] == "tool_use"
    ]  # fmt: skip
    if parts or calls:
        only_text = all(part["type"] == "text" for part in parts)
        content: Any = "\n".join(part["text"] for part in parts) if only_text else parts
        chat: dict[str, Any] = {"role": message["role"], "content": content if parts else None}
        if calls:
            chat["tool_calls"] = calls
        out.append(chat)
    return out


def _part(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    if block["type"] == "image":
        return {"type": "image_url", "image_url": {"url": f"data:{block['mimeType']};base64,{block['data']}"}}
    audio_format = str(block.get("mimeType", "audio/wav")).rsplit("/", 1)[-1]
    return {"type": "input_audio", "input_audio": {"data": block["data"], "format": audio_format}}


def _tool_result_text(block: dict[str, Any]) -> str:
    texts = [part.get("text", "") for part in block.get("content") or [] if part.get("type") == "text"]
    if block.get("structuredContent") is not None:
        texts.append(json.dumps(block["structuredContent"]))
    text = "\n".join(texts)
    return f"error: {text}" if block.get("isError") else text


def answer_from_completion(completion: dict[str, Any], model: str, tools: bool) -> dict[str, Any]:
    """The MCP sampling result (JSON) for a chat completion; `tools`: whether the request offered tools.

    Raises:
        KeyError, IndexError, TypeError: `completion` is not a chat completion.
    """
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    calls = (message.get("tool_calls") or []) if tools else []  # tool calls the request did not allow are dropped
    for call in calls:
        function = call["function"]
        content.append({"type": "tool_use", "id": call.get("id") or f"call-{uuid.uuid4().hex[:12]}",
                        "name": function["name"], "input": _arguments(function.get("arguments"))})  # fmt: skip
    reason = choice.get("finish_reason")
    answer: dict[str, Any] = {
        "role": "assistant",
        "model": completion.get("model") or model,
        "stopReason": _STOP_REASONS.get(reason, reason) if reason else None,
        "content": content if tools else (content[0] if content else {"type": "text", "text": ""}),
    }
    if tools and not content:
        answer["content"] = [{"type": "text", "text": ""}]
    usage = completion.get("usage") or {}
    if isinstance(usage.get("prompt_tokens"), int):
        answer["_meta"] = {
            SAMPLING_USAGE_META: {"inputTokens": usage["prompt_tokens"], "outputTokens": usage.get("completion_tokens")}
        }
    return {key: value for key, value in answer.items() if value is not None}


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments: JSON text as the API sends them (some servers send an object)."""
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {"arguments": raw}  # not JSON: the tool's schema check tells the model so
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}
