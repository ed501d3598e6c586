"""`tasks/get`, `tasks/update` and `tasks/cancel`.

Server tier. Each handler checks, in this order, that the request declares the extension
(-32021 before any lookup), that its Mcp-Name header names the task (-32020), and that the task
exists and belongs to the caller (-32602 otherwise, the same answer for unknown, expired and
foreign ids); then it reads or writes Redis only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pydantic
from mcp import types

from mcp_celery.inputs import invalid_answer_reason
from mcp_celery.protocol import now_ms
from mcp_celery.server import envelope, limits
from mcp_celery.server.envelope import RequestContext
from mcp_celery.server.service import TaskService
from mcp_celery.status import TaskView
from mcp_celery.store.schema import TaskRecord

__all__ = [
    "TaskIdParams",
    "UpdateTaskParams",
    "tasks_cancel",
    "tasks_get",
    "tasks_update",
    "visible_task",
    "visible_tasks",
]

logger = logging.getLogger(__name__)


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    # Values stay untyped: answers under keys that are not outstanding are ignored,
    # whatever they hold, so they must not fail validation here.
    model_config = pydantic.ConfigDict(extra="allow")
    input_responses: dict[str, Any]


async def tasks_get(service: TaskService, ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    record, view = await _lookup(service, ctx, params.task_id)
    return {"resultType": "complete", **view.detailed_task(record, now_ms())}


async def tasks_update(service: TaskService, ctx: RequestContext, params: UpdateTaskParams) -> dict[str, Any]:
    limits.check_input_responses(service.settings, params.input_responses)
    record, view = await _lookup(service, ctx, params.task_id)
    if view.status != "input_required":
        return {}
    answers: dict[str, str] = {}
    for key, answer in params.input_responses.items():
        request = record.inputs.get(key)
        if request is None:
            continue  # never issued, already answered or withdrawn: ignored (spec SHOULD)
        reason = invalid_answer_reason(request, answer)
        if reason:
            logger.info("task %s: answer to %r rejected, request stays outstanding: %s", record.task_id, key, reason)
            continue
        answers[key] = json.dumps(answer)
    if answers:
        await service.store.answer(record.task_id, answers, now_ms())
    return {}


async def tasks_cancel(service: TaskService, ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    record, view = await _lookup(service, ctx, params.task_id)
    if not view.terminal and record.cancel_ms is None:
        await service.cancel(record.task_id, service.tools.get(record.tool))
    return {}


async def _lookup(service: TaskService, ctx: RequestContext, task_id: str) -> tuple[TaskRecord, TaskView]:
    """Gate, header check and read shared by tasks/get, tasks/update and tasks/cancel."""
    envelope.require_tasks_extension(ctx)
    envelope.check_task_name(ctx, task_id)
    found = await visible_task(service, ctx, task_id)
    if found is None:
        raise envelope.task_not_found()
    return found


async def visible_task(service: TaskService, ctx: RequestContext, task_id: str) -> tuple[TaskRecord, TaskView] | None:
    """The task when it exists and belongs to the caller; unknown, expired, foreign and impossible ids look alike."""
    # An id longer than any we issue is not looked up: it gets the unknown-task answer.
    if not limits.task_id_acceptable(service.settings, task_id):
        return None
    found = await service.read_view(task_id)
    return found if found is not None and found[0].owner == envelope.principal(ctx) else None


async def visible_tasks(
    service: TaskService, ctx: RequestContext, task_ids: list[str]
) -> dict[str, tuple[TaskRecord, TaskView]]:
    """`visible_task` of several ids in one round trip: only those that exist and belong to the caller."""
    acceptable = [task_id for task_id in task_ids if limits.task_id_acceptable(service.settings, task_id)]
    caller = envelope.principal(ctx)
    views = await service.read_views(acceptable)
    return {task_id: found for task_id, found in views.items() if found[0].owner == caller}
