"""The task handle a plain call answers with when its job runs past the inline window, and its schema.

Server tier. The handle is an ordinary successful `CallToolResult`: words for the model (`wording`),
the same facts as `structuredContent` (for hosts that show their model only that part), and
`{"taskId", "status"}` in `_meta["mcp-celery/task"]` for programs. A tool with an output schema
lists it widened to accept the handle too (`with_task_handle`): SDK clients validate a result's
structuredContent against the schema, and a handle must pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcp_celery.protocol import TASK_HANDLE_META

__all__ = ["GUIDANCE_PROPERTIES", "TASK_HANDLE_SCHEMA", "handle_result", "with_task_handle"]

#: The fields every result of the fallback adds to its structuredContent (`wording.guidance`).
GUIDANCE_PROPERTIES: Final[dict[str, Any]] = {
    "message": {
        "type": "string",
        "description": "This result in words, as its text says it: what happened, and which call to make next.",
    },
    "nextCall": {
        "type": "object",
        "description": "The call to make next, absent once the task has ended: task_status with these arguments to "
        "wait for the result, or task_respond to answer the job's questions.",
        "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
        "required": ["tool", "arguments"],
    },
    "exampleAnswer": {
        "type": "object",
        "description": "While the job asks: task_respond's responses, one answer per open question (key -> answer) "
        "in the shape it takes, with placeholder values to replace with the real answers.",
    },
    "outputTail": {
        "type": "array",
        "items": {"type": "string"},
        "description": "The last lines of the job's live output (all of it: resources/read "
        "mcp-celery://tasks/{taskId}/output).",
    },
}

#: The `structuredContent` of a handle.
TASK_HANDLE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": "TaskHandle",
    "description": "The job is still running as an MCP task: follow it with the task_status tool.",
    "properties": {
        "taskId": {"type": "string"},
        "status": {"type": "string", "enum": ["working", "input_required"]},
        "statusMessage": {"type": "string"},
        **GUIDANCE_PROPERTIES,
    },
    "required": ["taskId", "status"],
    "additionalProperties": False,
}


def handle_result(task_id: str, status: str, status_message: str | None, guidance: Mapping[str, Any]) -> dict[str, Any]:
    """A successful `CallToolResult` saying that the job runs on as task `task_id`; `guidance["message"]`: the words."""
    handle = {"taskId": task_id, "status": status}
    own = {"statusMessage": status_message} if status_message else {}
    return {
        "resultType": "complete",
        "content": [{"type": "text", "text": guidance["message"]}],
        "structuredContent": {**handle, **own, **guidance},
        "isError": False,
        "_meta": {TASK_HANDLE_META: handle},
    }


def with_task_handle(output_schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's output schema, widened to accept the task handle too (clients without the extension).

    The schema's definitions stay at the root, where its `#/$defs/...` references point.
    """
    own = dict(output_schema)
    defs = own.pop("$defs", None)
    widened: dict[str, Any] = {"type": "object", "anyOf": [own, TASK_HANDLE_SCHEMA]}
    if defs is not None:
        widened["$defs"] = defs
    return widened
