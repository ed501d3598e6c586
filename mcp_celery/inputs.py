"""Input requests a job sends to the client (SEP-2663 `inputRequests`), and their answers.

Pure functions used on both sides: the job builds requests and checks the client can
answer them; the server validates answers before a job ever sees them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
import pydantic
from mcp_types import CreateMessageResult, CreateMessageResultWithTools, ElicitResult, ListRootsResult

from mcp_celery.errors import InputNotSupported
from mcp_celery.protocol import CAPABILITY_FOR_METHOD

__all__ = [
    "Answered",
    "SAMPLING_DECLINED",
    "SAMPLING_USAGE_META",
    "ToolChoiceMode",
    "declined_sampling",
    "elicitation",
    "invalid_answer_reason",
    "missing_capability",
    "roots_request",
    "sampling",
    "sampling_answer_model",
]

ToolChoiceMode = Literal["auto", "required", "none"]

#: The `stopReason` of a sampling answer that holds no completion: the client, its user or its model
#: declined or failed. A task's input request has no error answer (an `InputResponse` is a result), so
#: mcp-celery's client answers so instead of leaving the task waiting; the text says why.
SAMPLING_DECLINED = "declined"
#: The `_meta` key of a sampling answer under which mcp-celery's client reports the tokens the model
#: used, `{"inputTokens": n, "outputTokens": m}`, when the model's server said (sampling has no field for it).
SAMPLING_USAGE_META = "mcp-celery/usage"


def elicitation(message: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A form elicitation request: ask the user `message`, answer shaped by the JSON `schema`."""
    if schema.get("type") != "object":
        raise ValueError("an elicitation schema must be a JSON object schema ({'type': 'object', ...})")
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": dict(schema)},
    }


def sampling(
    messages: Sequence[Mapping[str, Any]] | str,
    max_tokens: int = 1000,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: ToolChoiceMode | None = None,
    **params: Any,
) -> dict[str, Any]:
    """A `sampling/createMessage` request. A plain string becomes one user text message.

    Args:
        messages: the conversation (`SamplingMessage`s as JSON), or one user text.
        max_tokens: `maxTokens`.
        tools: MCP `Tool`s as JSON (`name`, `description`, `inputSchema`) the model may call; the
            answer may then hold `tool_use` blocks, and the client must declare `sampling.tools`.
        tool_choice: `toolChoice.mode`: "auto" (the default when tools are given), "required" or "none".
        params: sent as they are (camelCase, e.g. systemPrompt=...).
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": {"type": "text", "text": messages}}]
    body: dict[str, Any] = {"messages": list(messages), "maxTokens": max_tokens, **params}
    if tools is not None:
        body["tools"] = [dict(tool) for tool in tools]
    if tool_choice is not None:
        body["toolChoice"] = {"mode": tool_choice}
    return {"method": "sampling/createMessage", "params": body}


def declined_sampling(reason: str) -> dict[str, Any]:
    """The answer to a sampling request that the client cannot or will not complete (see SAMPLING_DECLINED)."""
    return {
        "role": "assistant",
        "content": {"type": "text", "text": reason},
        "model": "none",
        "stopReason": SAMPLING_DECLINED,
    }


def sampling_answer_model(params: Mapping[str, Any]) -> type[CreateMessageResult | CreateMessageResultWithTools]:
    """What answers a sampling request: with `tools` declared, content may be a list with `tool_use` blocks."""
    return CreateMessageResultWithTools if params.get("tools") else CreateMessageResult


def roots_request() -> dict[str, Any]:
    """A `roots/list` request."""
    return {"method": "roots/list", "params": {}}


def missing_capability(request: Mapping[str, Any], capabilities: Mapping[str, Any]) -> str | None:
    """Why the client cannot answer `request`, or None when it can.

    Raises:
        InputNotSupported: the request is not an input request at all.
    """
    method = request.get("method")
    needed = CAPABILITY_FOR_METHOD.get(str(method))
    if needed is None:
        raise InputNotSupported(f"{method!r} is not an input request; use one of {sorted(CAPABILITY_FOR_METHOD)}")
    declared = capabilities.get(needed)
    if not isinstance(declared, dict):
        return f"the client did not declare the {needed!r} capability"
    if needed == "sampling":
        params = request.get("params") or {}
        if (params.get("tools") or params.get("toolChoice")) and not isinstance(declared.get("tools"), dict):
            return "the client's sampling capability does not include tools (sampling.tools)"
    if needed == "elicitation":
        mode = (request.get("params") or {}).get("mode", "form")
        # An empty elicitation capability means form mode only (core spec).
        if declared and mode not in declared:
            return f"the client's elicitation capability does not include {mode!r} mode"
        if not declared and mode != "form":
            return f"the client's elicitation capability does not include {mode!r} mode"
    return None


def invalid_answer_reason(request: Mapping[str, Any], answer: Any) -> str | None:
    """Why `answer` does not answer `request`, or None when it is acceptable."""
    method = str(request.get("method"))
    params = request.get("params") or {}
    model: type[pydantic.BaseModel] = ListRootsResult
    if method == "elicitation/create":
        model = ElicitResult
    elif method == "sampling/createMessage":
        model = sampling_answer_model(params)
    try:
        parsed = model.model_validate(answer)
    except pydantic.ValidationError as exc:
        return f"not a {model.__name__}: {exc.errors()[0]['msg']}"
    if isinstance(parsed, CreateMessageResultWithTools):
        return _unknown_tool_reason(parsed, params)
    if isinstance(parsed, ElicitResult) and parsed.action == "accept":
        schema = (request.get("params") or {}).get("requestedSchema")
        if schema:
            error = jsonschema.exceptions.best_match(
                _validator(json.dumps(schema, sort_keys=True)).iter_errors(parsed.content or {})
            )
            if error is not None:
                return f"content does not match the requested schema: {error.message}"
    return None


def _unknown_tool_reason(answer: CreateMessageResultWithTools, params: Mapping[str, Any]) -> str | None:
    """A `tool_use` block must name one of the request's tools (the spec's MUST)."""
    offered = {str(tool.get("name")) for tool in params.get("tools") or [] if isinstance(tool, Mapping)}
    for block in answer.content_as_list:
        if block.type == "tool_use" and block.name not in offered:
            return f"tool_use names {block.name!r}, which the request did not offer (offered: {sorted(offered)})"
    return None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A compiled validator per schema: jsonschema.validate() re-checks the schema itself on every call."""
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


@dataclass(frozen=True)
class Answered:
    """What became of answers: taken, rejected (key: why), ignored (not outstanding), and what is still open."""

    taken: list[str] = field(default_factory=lambda: [])
    rejected: dict[str, str] = field(default_factory=lambda: {})
    ignored: list[str] = field(default_factory=lambda: [])
    still_open: list[str] = field(default_factory=lambda: [])
