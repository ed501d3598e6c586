"""Input requests a job sends to the client (SEP-2663 `inputRequests`), and their answers.

Pure functions used on both sides: the job builds requests and checks the client can
answer them; the server validates answers before a job ever sees them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pydantic
from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult

from mcp_celery.errors import InputNotSupported
from mcp_celery.protocol import CAPABILITY_FOR_METHOD

__all__ = ["elicitation", "invalid_answer_reason", "missing_capability", "roots_request", "sampling"]


def elicitation(message: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A form elicitation request: ask the user `message`, answer shaped by the JSON `schema`."""
    if schema.get("type") != "object":
        raise ValueError("an elicitation schema must be a JSON object schema ({'type': 'object', ...})")
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": dict(schema)},
    }


def sampling(messages: Sequence[Mapping[str, Any]] | str, max_tokens: int = 1000, **params: Any) -> dict[str, Any]:
    """A `sampling/createMessage` request. A plain string becomes one user text message.

    Extra keyword arguments are sent as they are (camelCase, e.g. systemPrompt=...).
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": {"type": "text", "text": messages}}]
    return {
        "method": "sampling/createMessage",
        "params": {"messages": list(messages), "maxTokens": max_tokens, **params},
    }


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
    models: dict[str, type[pydantic.BaseModel]] = {
        "elicitation/create": ElicitResult,
        "sampling/createMessage": CreateMessageResult,
    }
    model = models.get(str(request.get("method")), ListRootsResult)
    try:
        parsed = model.model_validate(answer)
    except pydantic.ValidationError as exc:
        return f"not a {model.__name__}: {exc.errors()[0]['msg']}"
    if isinstance(parsed, ElicitResult) and parsed.action == "accept":
        schema = (request.get("params") or {}).get("requestedSchema")
        if schema:
            error = jsonschema.exceptions.best_match(
                _validator(json.dumps(schema, sort_keys=True)).iter_errors(parsed.content or {})
            )
            if error is not None:
                return f"content does not match the requested schema: {error.message}"
    return None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A compiled validator per schema: jsonschema.validate() re-checks the schema itself on every call."""
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)
