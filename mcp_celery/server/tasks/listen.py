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

`resourceSubscriptions` may list tasks' live outputs, `mcp-celery://tasks/{taskId}/output`: those
of the caller's own tasks are acknowledged (any other URI is not, whether it names another's task,
an unknown one or something else), and each gets `notifications/resources/updated` as the job
writes lines, at most 4 a second (`pacing`), heard on the task's channel from whichever worker, so
through any replica. A subscribed output's task ending ends its subscription once the last update
went out, as a task id's does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from mcp_celery.core.status import TaskView
from mcp_celery.protocol import INVALID_PARAMS, QUEUED_MESSAGE, TaskStatusNotification, now_ms, split_output_uri
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.events import Watcher
from mcp_celery.server.engine.service import Found, TaskService
from mcp_celery.server.ops import metrics
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.server.tasks.pacing import OutputPacer

__all__ = ["listen"]

logger = logging.getLogger(__name__)

#: Most task ids one listen request may name.
MAX_TASK_IDS = 1000


async def listen(
    service: TaskService, ctx: RequestContext, params: types.SubscriptionsListenRequestParams
) -> types.SubscriptionsListenResult:
    """The `subscriptions/listen` handler: core filters, `taskIds` and the tasks' outputs in `resourceSubscriptions`."""
    subscription_id = ctx.request_id
    requested = params.notifications
    task_ids = _requested_task_ids(ctx, requested)
    outputs = _requested_outputs(service, requested)
    core = _honored_core(requested)
    meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
    acceptable = [task_id for task_id in task_ids if limits.task_id_acceptable(service.settings, task_id)]
    with metrics.listen_stream():
        await _serve(service, ctx, _Asked(acceptable, outputs, core, bool(task_ids)), meta)
    return types.SubscriptionsListenResult(_meta=meta)


@dataclass(frozen=True)
class _Asked:
    """What a listen request asked for: tasks' states, tasks' outputs (task id -> URI), the core filters."""

    task_ids: list[str]
    outputs: dict[str, str]
    core: dict[str, Any]
    named_task_ids: bool  # `taskIds` was in the request (acknowledged even when none is the caller's)


async def _serve(service: TaskService, ctx: RequestContext, asked: _Asked, meta: dict[str, Any]) -> None:
    """Acknowledge the subscription, then stream the tasks' states until they end (or the client goes)."""
    subscription_id = ctx.request_id
    task_ids = list(dict.fromkeys([*asked.task_ids, *asked.outputs]))  # a task's state and output: one read
    async with service.events.watch(task_ids, asked.outputs) as watcher:
        # Watching before the one read of every task (which both checks it is the caller's and
        # gives its first state): a change between the read and the wait is not lost. Channels of
        # ids that turn out unknown or foreign carry only "look again", which nobody acts on.
        first = await service.find_many(envelope.principal(ctx), task_ids)
        owned = [task_id for task_id in asked.task_ids if task_id in first]
        outputs = {task_id: uri for task_id, uri in asked.outputs.items() if task_id in first}
        acknowledged = types.SubscriptionFilter.model_validate(
            {
                **asked.core,
                **({"taskIds": owned} if asked.named_task_ids else {}),
                **({"resourceSubscriptions": list(outputs.values())} if outputs else {}),
            }
        )
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(
                params=types.SubscriptionsAcknowledgedNotificationParams(notifications=acknowledged, _meta=meta)
            ),
            related_request_id=subscription_id,
        )
        stream = _Stream(service, ctx, meta, set(owned), OutputPacer(outputs))
        await stream.run(first, watcher, keep_open=bool(asked.core))


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


def _requested_outputs(service: TaskService, requested: types.SubscriptionFilter) -> dict[str, str]:
    """The tasks whose output URIs the client lists (task id -> URI); other URIs are not honored: nothing
    else this server serves changes (an artifact written again is linked from the result anew)."""
    uris = requested.resource_subscriptions or []
    if len(uris) > MAX_TASK_IDS:
        raise MCPError(INVALID_PARAMS, f"notifications.resourceSubscriptions may name at most {MAX_TASK_IDS} URIs")
    outputs = {}
    for uri in uris:
        task_id = split_output_uri(uri)
        if task_id is not None and limits.task_id_acceptable(service.settings, task_id):
            outputs[task_id] = uri
    return outputs


def _honored_core(requested: types.SubscriptionFilter) -> dict[str, Any]:
    """The core flags the client asked for, echoed in the acknowledgement (camelCase, only the true ones)."""
    dumped = requested.model_dump(by_alias=True, exclude_none=True, mode="json")
    dumped.pop("taskIds", None)
    dumped.pop("resourceSubscriptions", None)  # acknowledged apart: only the caller's tasks' outputs
    return {key: value for key, value in dumped.items() if value}


class _Stream:
    """One listen stream after its acknowledgement: task notifications, and the outputs' updates, paced."""

    def __init__(
        self, service: TaskService, ctx: RequestContext, meta: dict[str, Any], notified: set[str], pacer: OutputPacer
    ) -> None:
        self.service, self.ctx, self.meta = service, ctx, meta
        self.notified = notified  # the tasks whose states are sent (`taskIds`); the others' end closes their output
        self.pacer = pacer
        # What each task's creation answer said counts as sent: a task still queued is not sent again.
        self.sent: dict[str, tuple[Any, ...]] = dict.fromkeys(notified, _CREATION_ANSWER)

    async def run(self, first: dict[str, Found], watcher: Watcher, *, keep_open: bool) -> None:
        """Send each task's state now (`first`: as just read) and at every change, and each output's updates,
        until every task is terminal and its output's last update sent."""
        pending, dirty, views = set(first), set(first), first
        while True:
            wake = await self._send_states(views, dirty & pending, pending)
            await self._send_outputs()
            if not (pending or keep_open or self.pacer.due):
                return
            wakes = [at for at in (wake, self.pacer.next_at()) if at is not None]
            timeout = None if not wakes else max(min(wakes) - anyio.current_time(), 0)
            dirty = await watcher.changed(timeout)
            self.pacer.grew(watcher.grown())
            if wake is not None and anyio.current_time() >= wake:
                dirty |= pending
            views = await self.service.read_views(sorted(dirty & pending))  # one round trip for all that changed
            await anyio.lowlevel.checkpoint()

    async def _send_states(self, views: dict[str, Found], dirty: set[str], pending: set[str]) -> float | None:
        """Notify the changed tasks' states; forget the terminal ones. Returns when to look again, if ever."""
        wake: float | None = None
        for task_id in sorted(dirty):
            found = views.get(task_id)
            if found is None:  # expired while watched: nothing more will ever be sent for it
                pending.discard(task_id)
                continue
            record, view = found
            signature = _signature(view)
            if task_id in self.notified and self.sent.get(task_id) != signature:
                self.sent[task_id] = signature
                task = view.detailed_task(record, now_ms())
                await self.ctx.session.send_notification(
                    TaskStatusNotification(params={**task, "_meta": self.meta}),  # type: ignore[arg-type]
                    related_request_id=self.ctx.request_id,
                )
            if view.terminal:
                pending.discard(task_id)
            elif record.cancel_ms is not None:
                # A job that ignores a cancel turns `cancelled` when the grace runs out: no event says so.
                grace_s = record.cancel_ms / 1000 + self.service.settings.cancel_grace_s - now_ms() / 1000
                at = anyio.current_time() + max(grace_s, 0) + 0.001
                wake = at if wake is None else min(wake, at)
        return wake

    async def _send_outputs(self) -> None:
        for uri in self.pacer.take(anyio.current_time()):
            await self.ctx.session.send_notification(
                types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=uri, _meta=self.meta)
                ),
                related_request_id=self.ctx.request_id,
            )


def _signature(view: TaskView) -> tuple[Any, ...]:
    """What a notification of `view` tells that an earlier one may not have: a change of this sends one."""
    return view.status, view.status_message, tuple(sorted(view.input_requests or {}))


#: What every task's creation answer told (`working`, "queued"), as `_signature` sees it.
_CREATION_ANSWER = _signature(TaskView("working", 0, QUEUED_MESSAGE))
