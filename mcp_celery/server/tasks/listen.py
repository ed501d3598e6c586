"""`subscriptions/listen` with `notifications.taskIds`: `notifications/tasks` pushed to the client.

Server tier. A listen request's response is the stream: the acknowledgement first (listing
exactly the task ids that exist and belong to the caller), then for each acknowledged task
its current state and one `notifications/tasks` per status change or new `statusMessage`,
each the full `DetailedTask` that `tasks/get` would return at that moment. A task still
queued is not sent at first: its creation answer (`working`, "queued") told that state to
whoever holds its id, so a stream over jobs created just before it carries one notification
each, their ends, unless they change on the way. After a task's
terminal notification nothing more is sent for it; once every acknowledged task is terminal
the stream ends with the listen result, unless the client also asked for the core
list-changed filters, which keep it open until the client goes away (this server's tool list
never changes, so those never fire). Nothing here lives beyond the stream: a dropped client
cancels the handler, which unsubscribes its channels.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from mcp_celery.core.status import TaskView
from mcp_celery.protocol import INVALID_PARAMS, QUEUED_MESSAGE, TaskStatusNotification, now_ms
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.service import TaskService
from mcp_celery.server.ops import metrics
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.store.schema import TaskRecord

__all__ = ["listen"]

logger = logging.getLogger(__name__)

#: Most task ids one listen request may name.
MAX_TASK_IDS = 1000


async def listen(
    service: TaskService, ctx: RequestContext, params: types.SubscriptionsListenRequestParams
) -> types.SubscriptionsListenResult:
    """The `subscriptions/listen` handler: core filters and `taskIds`."""
    subscription_id = ctx.request_id
    requested = params.notifications
    task_ids = _requested_task_ids(ctx, requested)
    core = _honored_core(requested)
    meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
    acceptable = [task_id for task_id in task_ids if limits.task_id_acceptable(service.settings, task_id)]
    with metrics.listen_stream():
        await _serve(service, ctx, acceptable, core, meta, task_ids=bool(task_ids))
    return types.SubscriptionsListenResult(_meta=meta)


async def _serve(
    service: TaskService,
    ctx: RequestContext,
    acceptable: list[str],
    core: dict[str, Any],
    meta: dict[str, Any],
    *,
    task_ids: bool,
) -> None:
    """Acknowledge the subscription, then stream the tasks' states until they end (or the client goes)."""
    subscription_id = ctx.request_id
    async with service.events.watch(acceptable) as watcher:
        # Watching before the one read of every task (which both checks it is the caller's and
        # gives its first state): a change between the read and the wait is not lost. Channels of
        # ids that turn out unknown or foreign carry only "look again", which nobody acts on.
        first = await service.find_many(envelope.principal(ctx), acceptable)
        owned = [task_id for task_id in acceptable if task_id in first]
        acknowledged = types.SubscriptionFilter.model_validate({**core, **({"taskIds": owned} if task_ids else {})})
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(
                params=types.SubscriptionsAcknowledgedNotificationParams(notifications=acknowledged, _meta=meta)
            ),
            related_request_id=subscription_id,
        )
        await _stream(service, ctx, first, meta, watcher.changed, keep_open=bool(core))


def _requested_task_ids(ctx: RequestContext, requested: types.SubscriptionFilter) -> list[str]:
    raw = (requested.model_extra or {}).get("taskIds")
    if raw is None:
        return []
    envelope.require_tasks_extension(ctx)
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise MCPError(INVALID_PARAMS, "notifications.taskIds must be a list of task id strings")
    if len(raw) > MAX_TASK_IDS:
        raise MCPError(INVALID_PARAMS, f"notifications.taskIds may name at most {MAX_TASK_IDS} tasks")
    return list(dict.fromkeys(raw))


def _honored_core(requested: types.SubscriptionFilter) -> dict[str, Any]:
    """The core filters the client asked for, echoed in the acknowledgement (camelCase, only the true ones)."""
    dumped = requested.model_dump(by_alias=True, exclude_none=True, mode="json")
    dumped.pop("taskIds", None)
    return {key: value for key, value in dumped.items() if value}


async def _stream(
    service: TaskService,
    ctx: RequestContext,
    first: dict[str, tuple[TaskRecord, TaskView]],
    meta: dict[str, Any],
    changed: Any,
    *,
    keep_open: bool,
) -> None:
    """Send each task's state now (`first`: as just read) and at every change, until every one is terminal."""
    # What each task's creation answer said counts as sent: a task still queued is not sent again.
    sent: dict[str, tuple[Any, ...]] = dict.fromkeys(first, _CREATION_ANSWER)
    pending = set(first)
    dirty = set(first)
    views = first
    while pending or keep_open:
        wake_ms: int | None = None
        for task_id in sorted(dirty & pending):
            found = views.get(task_id)
            if found is None:  # expired while watched: nothing more will ever be sent for it
                pending.discard(task_id)
                continue
            record, view = found
            signature = _signature(view)
            if sent.get(task_id) != signature:
                sent[task_id] = signature
                task = view.detailed_task(record, now_ms())
                await ctx.session.send_notification(
                    TaskStatusNotification(params={**task, "_meta": meta}),  # type: ignore[arg-type]
                    related_request_id=ctx.request_id,
                )
            if view.terminal:
                pending.discard(task_id)
            elif record.cancel_ms is not None:
                # A job that ignores a cancel turns `cancelled` when the grace runs out: no event says so.
                deadline = record.cancel_ms + int(service.settings.cancel_grace_s * 1000) + 1
                wake_ms = deadline if wake_ms is None else min(wake_ms, deadline)
        if not pending and not keep_open:
            return
        timeout = None if wake_ms is None else max(wake_ms - now_ms(), 0) / 1000
        dirty = await changed(timeout)
        if wake_ms is not None and now_ms() >= wake_ms:
            dirty |= pending
        views = await service.read_views(sorted(dirty & pending))  # one round trip for all that changed
        await anyio.lowlevel.checkpoint()


def _signature(view: TaskView) -> tuple[Any, ...]:
    """What a notification of `view` tells that an earlier one may not have: a change of this sends one."""
    return view.status, view.status_message, tuple(sorted(view.input_requests or {}))


#: What every task's creation answer told (`working`, "queued"), as `_signature` sees it.
_CREATION_ANSWER = _signature(TaskView("working", 0, QUEUED_MESSAGE))
