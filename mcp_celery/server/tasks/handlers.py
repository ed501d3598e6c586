"""`tasks/get`, `tasks/update` and `tasks/cancel`: the SEP-2663 wire over the task service.

Server tier, a surface. Each handler checks, in this order, that the request declares the
extension (-32021 before any lookup), that its Mcp-Name header names the task (-32020), and that
the task exists and belongs to the caller (-32602 otherwise, the same answer for unknown, expired
and foreign ids); then the task service does the rest.
"""

from __future__ import annotations

from typing import Any

from mcp_celery.protocol import TaskIdParams, UpdateTaskParams
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.service import Found, TaskService
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext

__all__ = ["tasks_cancel", "tasks_get", "tasks_update"]


async def tasks_get(service: TaskService, ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    found = await _lookup(service, ctx, params.task_id)
    return {"resultType": "complete", **service.detailed_task(found)}


async def tasks_update(service: TaskService, ctx: RequestContext, params: UpdateTaskParams) -> dict[str, Any]:
    limits.check_input_responses(service.settings, params.input_responses)
    await service.answer(await _lookup(service, ctx, params.task_id), params.input_responses)
    return {}


async def tasks_cancel(service: TaskService, ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    await service.cancel_task(await _lookup(service, ctx, params.task_id))
    return {}


async def _lookup(service: TaskService, ctx: RequestContext, task_id: str) -> Found:
    """Gate, header check and owner check shared by tasks/get, tasks/update and tasks/cancel."""
    envelope.require_tasks_extension(ctx)
    envelope.check_task_name(ctx, task_id)
    found = await service.find(envelope.principal(ctx), task_id)
    if found is None:
        raise envelope.task_not_found()
    return found
