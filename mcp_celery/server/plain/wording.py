"""A task in words, for a model that reaches it through plain tool calls.

Server tier, shared by the plain call (`plain`) and the lifecycle tools (`lifecycle`). A host
without the tasks extension hands the model only a tool result's text, so that text says plainly
what happened, which tool to call next with which arguments and, for a question, the exact JSON
answer `task_respond` takes. Some hosts show their model only a result's `structuredContent`
(pydantic-ai whenever every content block is text, agent-framework by default), so the same facts
go there too (`guidance`): the words whole, the next call as data, the example answer and the
live output's tail.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp_celery.core.approvals import approval_of
from mcp_celery.core.status import TaskView
from mcp_celery.protocol import output_uri
from mcp_celery.server.engine.gate import PolicyGate
from mcp_celery.store.schema import TaskRecord

__all__ = [
    "NO_SUCH_TASK",
    "STATUS_TOOL",
    "RESPOND_TOOL",
    "CANCEL_TOOL",
    "call_text",
    "example_answers",
    "guidance",
    "next_call",
    "output_tail",
    "questions",
    "running",
    "state_of",
]

STATUS_TOOL, RESPOND_TOOL, CANCEL_TOOL = "task_status", "task_respond", "task_cancel"
#: Unknown, expired and other principals' task ids all get these words, so existence never leaks.
NO_SUCH_TASK = "no such task: {task_id!r} (unknown, expired, or not yours)"


def call_text(call: Mapping[str, Any]) -> str:
    """A call (`next_call`) as the words say it: `tool with {arguments}`."""
    return f"{call['tool']} with {json.dumps(call['arguments'])}"


def _call(tool: str, **arguments: Any) -> str:
    return call_text({"tool": tool, "arguments": arguments})


def next_call(task_id: str, view: TaskView, wait_s: float) -> dict[str, Any] | None:
    """The call to make next, as data (None once the task has ended): answer its questions, else wait for it."""
    if view.status == "input_required":
        responses = example_answers(view.input_requests or {})
        if not responses:  # approvals only: a person decides on the page; the model waits for it
            return {"tool": STATUS_TOOL, "arguments": {"task_id": task_id}}
        return {"tool": RESPOND_TOOL, "arguments": {"task_id": task_id, "responses": responses}}
    if view.status == "working":
        return {"tool": STATUS_TOOL, "arguments": {"task_id": task_id, "wait_seconds": wait_s}}
    return None


def guidance(message: str, task_id: str, view: TaskView, wait_s: float, output: list[str]) -> dict[str, Any]:
    """The facts of `message` as structuredContent fields, for hosts that show their model only that part."""
    fields: dict[str, Any] = {"message": message}
    call = next_call(task_id, view, wait_s)
    if call is not None:
        fields["nextCall"] = call
    examples = example_answers(view.input_requests or {}) if view.status == "input_required" else {}
    if examples:
        fields["exampleAnswer"] = examples
    if output:
        fields["outputTail"] = output
    return fields


def running(record: TaskRecord, view: TaskView, waited_s: float, wait_s: float) -> str:
    """What a plain call answers when its job is still running at the end of its inline window."""
    head = (
        f"The job is still running in the background after {waited_s:g} s; nothing was cancelled. "
        f"Task id: {record.task_id} (tool {record.tool})."
    )
    if PolicyGate.holds(record):  # no job yet: the approval policy holds the call until a person decides
        head = (
            f"The server's approval policy holds this call of {record.tool} until a person approves it: "
            f"nothing has run yet. Task id: {record.task_id}."
        )
    return f"{head}\n{state_of(record, view, wait_s)}"


def state_of(record: TaskRecord, view: TaskView, wait_s: float) -> str:
    """The task's status in words, with the next call to make."""
    task_id = record.task_id
    if view.status == "input_required":
        return questions(task_id, view.input_requests or {})
    if view.status == "working":
        last = f"Last status: {view.status_message}. " if view.status_message else ""
        return (
            f"{last}To wait for its result, call {_call(STATUS_TOOL, task_id=task_id, wait_seconds=wait_s)} "
            f"(it answers as soon as the task's status changes, at the latest after {wait_s:g} s); "
            f"to stop it, call {_call(CANCEL_TOOL, task_id=task_id)}."
        )
    if view.status == "failed":
        error = view.error or {}
        return f"The task failed: {error.get('message') or view.status_message} (JSON-RPC error {error.get('code')})."
    if view.status == "cancelled":
        return f"The task was cancelled ({view.status_message or 'cancelled'})."
    return "The task completed; its result follows."


def output_tail(task_id: str, lines: list[str]) -> str:
    """The last lines of the job's live output, and where the whole of it is."""
    return f"Its output ends with (all of it: resources/read {output_uri(task_id)}):\n" + "\n".join(lines)


def questions(task_id: str, requests: Mapping[str, Any]) -> str:
    """The job's outstanding questions, each with the exact answer `task_respond` takes."""
    lines = [f"The job is waiting for {'an answer' if len(requests) == 1 else 'answers'}:"]
    for key, request in sorted(requests.items()):
        lines.append(_approval(key, request) if approval_of(request) is not None else _question(key, request)[0])
    examples = example_answers(requests)
    if examples:
        lines.append(
            f"Answer with {_call(RESPOND_TOOL, task_id=task_id, responses=examples)}, "
            "putting the real answers in place of the examples (one call may answer several)."
        )
    else:
        lines.append(f"Nothing to answer here: to wait for the decision, call {_call(STATUS_TOOL, task_id=task_id)}.")
    return "\n".join(lines)


def example_answers(requests: Mapping[str, Any]) -> dict[str, Any]:
    """`task_respond`'s responses for `requests`: an answer of each one's shape, with placeholder values
    (approvals left out: a named person decides those on the approval page)."""
    return {
        key: _question(key, request)[1] for key, request in sorted(requests.items()) if approval_of(request) is None
    }


def _approval(key: str, request: Mapping[str, Any]) -> str:
    """An approval, which a named person decides on the server's page: the model has nothing to answer."""
    params = request.get("params") or {}
    approvers = (approval_of(request) or {}).get("approvers")
    who = f"one of {', '.join(approvers)}" if approvers else "an approver"
    return (
        f'- "{key}": a person decides on the approval page: "{params.get("message")}". Tell the user that '
        f"{who} must open {params.get('url')} and approve or deny it there."
    )


def _question(key: str, request: Mapping[str, Any]) -> tuple[str, Any]:
    method = request.get("method")
    params = request.get("params") or {}
    if method == "elicitation/create":
        if params.get("mode") == "url":
            text = f'- "{key}": ask the user to open {params.get("url")}: {params.get("message")}'
            return text + ' Answer {"action": "accept"} once they have, or {"action": "decline"}.', {"action": "accept"}
        schema = params.get("requestedSchema") or {}
        fields = _fields(schema)
        text = f'- "{key}": a question for the user: "{params.get("message")}"' + (f" ({fields})" if fields else "")
        text += '. Ask the user; if they refuse, answer {"action": "decline"}.'
        return text, {"action": "accept", "content": _example(schema)}
    if method == "sampling/createMessage":
        prompt = json.dumps(params.get("messages", []))
        system = f' System prompt: "{params["systemPrompt"]}".' if params.get("systemPrompt") else ""
        text = f'- "{key}": the job asks a model for a reply (at most {params.get("maxTokens")} tokens) to {prompt}.'
        example = {"role": "assistant", "content": {"type": "text", "text": "..."}, "model": "your model's name"}
        return text + system + " Write the reply yourself.", example
    text = f'- "{key}": the job asks for the roots (the folders the user works in), as file:// URIs.'
    return text, {"roots": [{"uri": "file:///path/to/folder", "name": "folder"}]}


def _fields(schema: Mapping[str, Any]) -> str:
    required = set(schema.get("required") or [])
    properties: Mapping[str, Any] = schema.get("properties") or {}
    return ", ".join(
        f"{name}: {spec.get('type', 'any')}{' (required)' if name in required else ''}"
        + (f" one of {spec['enum']}" if "enum" in spec else "")
        + (f", {spec['description']}" if spec.get("description") else "")
        for name, spec in properties.items()
    )


def _example(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An answer of the requested shape, with placeholder values the model replaces."""
    placeholders = {"string": "...", "number": 0, "integer": 0, "boolean": True}
    properties: Mapping[str, Any] = schema.get("properties") or {}
    return {
        name: (spec["enum"][0] if spec.get("enum") else placeholders.get(str(spec.get("type")), "..."))
        for name, spec in properties.items()
    }
