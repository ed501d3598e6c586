"""`task_status`, `task_respond` and `task_cancel`: tasks reached through plain tool calls.

Server tier, a surface over the task service. Listed only to requests that do not declare the
tasks extension (a tasks-aware client has `tasks/get`, `tasks/update` and `tasks/cancel`), they
are what a model uses when its host hands it a task handle from a plain call (`plain`): the same
owner check (an unknown, expired or foreign id is "no such task", alike), the same answer
validation and the same cancel as the SEP-2663 wire, from any replica and after a restart.

Each answers in words for the model (`wording`) and as `structuredContent`, which carries the same
words, next call, example answer and output tail (`wording.guidance`; some hosts show their model
only that part): `task_status` gives the task as `tasks/get` does (without `resultType`), the last
few lines of the job's live output, and, once the task completed, the job's own content blocks, so
the model reads the real result. A wait never outlasts the calling client's window (`windows`), and
misses no change (`_changed`).
"""

from __future__ import annotations

from typing import Any, get_args

import anyio
import pydantic
from mcp import types

from mcp_celery.protocol import TERMINAL_STATUSES, TaskStatus, tool_error_result
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.service import Found, TaskService
from mcp_celery.server.plain import windows, wording
from mcp_celery.server.plain.handle import GUIDANCE_PROPERTIES
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.store.output import last_lines

__all__ = ["NAMES", "TOOLS", "call"]

_TASK_ID = {"type": "string", "description": "The task id a tool call answered with."}
#: The lifecycle tools as `tools/list` shows them.
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": wording.STATUS_TOOL,
        "title": "Task status",
        "description": "The status of a job that is still running as a task (a tool call answered with its task "
        "id): its progress, its questions, or once it is done its result. With wait_seconds, waits until the "
        "status changes (done, failed, cancelled, or a new question) or that many seconds pass.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "task_id": _TASK_ID,
                "wait_seconds": {
                    "type": "number",
                    "minimum": 0,
                    "default": 0,
                    "description": "Wait up to this long for a change (capped at the tool's inline window).",
                },
            },
            "required": ["task_id"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "description": "The task, as the MCP Tasks extension's tasks/get returns it.",
            "properties": {
                "taskId": {"type": "string"},
                "status": {"type": "string", "enum": list(get_args(TaskStatus))},
                "statusMessage": {"type": "string"},
                "inputRequests": {"type": "object"},
                "result": {"type": "object"},
                "error": {"type": "object"},
                **GUIDANCE_PROPERTIES,
            },
            "required": ["taskId", "status", "message"],
        },
    },
    {
        "name": wording.RESPOND_TOOL,
        "title": "Answer a task's questions",
        "description": "Answer the questions a running task asks (task_status lists them, each under a key, with "
        "the exact answer shape). responses maps each key to its answer.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "task_id": _TASK_ID,
                "responses": {
                    "type": "object",
                    "additionalProperties": {"type": "object"},
                    "description": 'Key -> answer, e.g. {"elicit-1": {"action": "accept", "content": {"ok": true}}}.',
                },
            },
            "required": ["task_id", "responses"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "description": "What was taken of the answers, and what is still open.",
            "properties": {
                "taskId": {"type": "string"},
                "taken": {"type": "array", "items": {"type": "string"}, "description": "Keys answered by this call."},
                "rejected": {"type": "object", "description": "Key -> why the answer does not fit; still open."},
                "ignored": {"type": "array", "items": {"type": "string"}, "description": "Keys not open."},
                "stillOpen": {"type": "array", "items": {"type": "string"}, "description": "Keys still to answer."},
                **GUIDANCE_PROPERTIES,
            },
            "required": ["taskId", "taken", "rejected", "ignored", "stillOpen", "message"],
        },
    },
    {
        "name": wording.CANCEL_TOOL,
        "title": "Cancel a task",
        "description": "Stop a job that is running as a task. A job that has not started never runs.",
        "inputSchema": {
            "type": "object",
            "properties": {"task_id": _TASK_ID},
            "required": ["task_id"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "description": "The task's status after the cancel.",
            "properties": {
                "taskId": {"type": "string"},
                "status": {"type": "string", "enum": list(get_args(TaskStatus))},
                **GUIDANCE_PROPERTIES,
            },
            "required": ["taskId", "status", "message"],
        },
    },
)
NAMES = frozenset(tool["name"] for tool in TOOLS)


class _TaskArguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    task_id: str


class _StatusArguments(_TaskArguments):
    wait_seconds: float = pydantic.Field(default=0, ge=0)


class _RespondArguments(_TaskArguments):
    responses: dict[str, Any]


async def call(service: TaskService, ctx: RequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    """The `tools/call` of a lifecycle tool."""
    name = params.name
    try:
        if name == wording.STATUS_TOOL:
            return await _status(service, ctx, _StatusArguments.model_validate(params.arguments or {}))
        if name == wording.RESPOND_TOOL:
            return await _respond(service, ctx, _RespondArguments.model_validate(params.arguments or {}))
        return await _cancel(service, ctx, _TaskArguments.model_validate(params.arguments or {}))
    except pydantic.ValidationError as exc:
        return _error(name, str(exc))  # as for a job tool's invalid arguments


async def _status(service: TaskService, ctx: RequestContext, args: _StatusArguments) -> types.CallToolResult:
    principal = envelope.principal(ctx)
    found = await service.find(principal, args.task_id)
    if found is None:
        return _no_such_task(wording.STATUS_TOOL, args.task_id)
    wait_s = min(args.wait_seconds, _wait_cap(service, ctx, found[0].tool))
    if wait_s > 0 and found[1].status not in TERMINAL_STATUSES:
        found = await _changed(service, principal, found, wait_s) or found
    return await _status_result(service, ctx, found)


def _wait_cap(service: TaskService, ctx: RequestContext, tool: str) -> float:
    """The longest wait of a lifecycle call: the tool's window for this client, progress aside (none is sent)."""
    client = windows.Client(envelope.client_name(ctx), progress_token=False)
    return windows.window_s(service.settings, service.tools.get(tool), client)


async def _guidance(service: TaskService, ctx: RequestContext, found: Found, message: str) -> dict[str, Any]:
    """The structuredContent fields that say what `message` says (`wording.guidance`), with the output's tail."""
    output = last_lines(await service.output_of(found))
    return wording.guidance(message, found[0].task_id, found[1], _wait_cap(service, ctx, found[0].tool), output)


async def _changed(service: TaskService, principal: str, found: Found, wait_s: float) -> Found | None:
    """The task once its status differs from `found`'s (new questions count), or as it is after `wait_s` seconds.

    Subscribe, then read, then wait: a change published after `found` was read but before the
    subscription took is in the read made under the watch, so it is never slept through.
    """
    task_id = found[0].task_id
    seen = _state(found)
    deadline = anyio.current_time() + wait_s
    async with service.events.watch([task_id]) as watcher:
        while True:
            latest = await service.find(principal, task_id)
            left = deadline - anyio.current_time()
            if latest is None or _state(latest) != seen or left <= 0:
                return latest
            await watcher.changed(left)


def _state(found: Found) -> tuple[str, tuple[str, ...]]:
    """What a status wait compares: the status and the keys of the open questions."""
    view = found[1]
    return view.status, tuple(sorted(view.input_requests or {}))


async def _status_result(service: TaskService, ctx: RequestContext, found: Found) -> types.CallToolResult:
    record, view = found
    wait_s = _wait_cap(service, ctx, record.tool)
    words = f"Task {record.task_id} (tool {record.tool}) is {view.status}. {wording.state_of(record, view, wait_s)}"
    guidance = await _guidance(service, ctx, found, words)
    content: list[dict[str, Any]] = [{"type": "text", "text": words}]
    if "outputTail" in guidance:  # a glimpse of the job's live output: the host may not read resources
        content.append({"type": "text", "text": wording.output_tail(record.task_id, guidance["outputTail"])})
    is_error = view.status == "failed"
    if view.status == "completed" and view.result is not None:
        content += list(view.result.get("content") or [])  # the job's own result, for the model to read
        is_error = bool(view.result.get("isError"))
    structured = {**service.detailed_task(found), **guidance}
    return types.CallToolResult.model_validate(
        {"content": content, "structuredContent": structured, "isError": is_error}
    )


async def _respond(service: TaskService, ctx: RequestContext, args: _RespondArguments) -> types.CallToolResult:
    limits.check_input_responses(service.settings, args.responses)
    principal = envelope.principal(ctx)
    found = await service.find(principal, args.task_id)
    if found is None:
        return _no_such_task(wording.RESPOND_TOOL, args.task_id)
    answered = await service.answer(found, args.responses)
    lines = []
    if found[1].status != "input_required":
        lines.append(f"The task is not waiting for answers (it is {found[1].status}); nothing was taken.")
    if answered.taken:
        lines.append(f"Taken: {', '.join(answered.taken)}.")
    lines += [f"Rejected {key!r}: {reason}; it is still open." for key, reason in answered.rejected.items()]
    if answered.ignored and found[1].status == "input_required":
        lines.append(f"Ignored (not an open question): {', '.join(answered.ignored)}.")
    if answered.still_open:
        lines.append(f"Still open: {', '.join(answered.still_open)}.")
    elif answered.taken:
        lines.append(f"Every question is answered; the job goes on. Follow it with {wording.STATUS_TOOL}.")
    after = await service.find(principal, args.task_id) or found  # what to do next depends on the task now
    text, read = _then(service, ctx, after, " ".join(lines)), None
    if after[1].terminal and answered.taken:  # ended already: its result is one task_status away
        read = {"tool": wording.STATUS_TOOL, "arguments": {"task_id": found[0].task_id}}
        text += f"\nThe task has ended ({after[1].status}): read it with {wording.call_text(read)}."
    structured = {
        "taskId": found[0].task_id,
        "taken": answered.taken,
        "rejected": answered.rejected,
        "ignored": answered.ignored,
        "stillOpen": answered.still_open,
        **await _guidance(service, ctx, after, text),
        **({"nextCall": read} if read else {}),
    }
    # Nothing taken from a non-empty answer: the model's answer missed, say so as an error it notices.
    is_error = bool(args.responses) and not answered.taken
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": is_error}
    )


async def _cancel(service: TaskService, ctx: RequestContext, args: _TaskArguments) -> types.CallToolResult:
    principal = envelope.principal(ctx)
    found = await service.find(principal, args.task_id)
    if found is None:
        return _no_such_task(wording.CANCEL_TOOL, args.task_id)
    if found[1].status in TERMINAL_STATUSES:
        text = f"The task has ended already ({found[1].status}); nothing changed."
    else:
        await service.cancel_task(found)
        after = await service.find(principal, args.task_id) or found
        text = (
            "Cancelled."
            if after[1].status == "cancelled"
            else f"Cancel requested: the job stops at its next checkpoint (status now: {after[1].status})."
        )
        found = after
        text = _then(service, ctx, found, text)
    structured = {"taskId": found[0].task_id, "status": found[1].status, **await _guidance(service, ctx, found, text)}
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}
    )


def _then(service: TaskService, ctx: RequestContext, found: Found, text: str) -> str:
    """`text`, then what to do next in words while the task runs on (the same call as `nextCall`)."""
    record, view = found
    if view.terminal:
        return text
    return f"{text}\n{wording.state_of(record, view, _wait_cap(service, ctx, record.tool))}"


def _no_such_task(tool: str, task_id: str) -> types.CallToolResult:
    shown = task_id if len(task_id) <= 64 else task_id[:64] + "..."  # never echo a huge argument back
    return _error(tool, wording.NO_SUCH_TASK.format(task_id=shown))


def _error(tool: str, reason: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate(tool_error_result(tool, reason))
