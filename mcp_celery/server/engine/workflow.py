"""A task handed over to a workflow, as the task service reads and answers it.

Server tier, beside the task service (`service`), whose primitives it uses through `Members`
(the service is one; this module does not import it). The task's view comes
from its members' (`mcp_celery.core.workflows.aggregate`, the same function the worker runs when a member
ends), and the step it calls for is taken here when a server reads the task first: cancel the other
members, launch the merge step (claimed once), freeze the end. Answers to the task's questions go to
the member whose label prefixes each key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import anyio

from mcp_celery.core.canvas import launch_merge
from mcp_celery.core.status import Found, TaskView, expired
from mcp_celery.core.tools import ToolSpec
from mcp_celery.core.workflows import Workflow, aggregate, member_key, split_member_key
from mcp_celery.inputs import Answered
from mcp_celery.protocol import now_ms
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.schema import TaskRecord

__all__ = ["Members", "answer", "view"]


class Members(Protocol):
    """What a workflow's task is read and answered through (the task service): its members' views,
    their cancel and answers, the store, and when a new message is first looked for."""

    @property
    def store(self) -> AsyncStore: ...

    @property
    def app(self) -> Any: ...

    @property
    def tools(self) -> dict[str, ToolSpec]: ...

    @property
    def grace_ms(self) -> int: ...

    def first_check_ms(self, created_ms: int) -> int | None: ...

    async def read_view(self, task_id: str, *, confirmed: bool = False) -> Found | None: ...

    async def read_views(self, task_ids: Sequence[str], *, follow_parent: bool = True) -> dict[str, Found]: ...

    async def cancel(self, task_id: str, spec: ToolSpec | None, *, channel: str | None = None) -> None: ...

    async def answer(self, found: Found, responses: Mapping[str, Any]) -> Answered: ...


async def view(service: Members, record: TaskRecord) -> Found | None:
    """A task handed over to a workflow: its view from its members', and the step they call for."""
    assert record.workflow is not None
    workflow = Workflow.from_json(record.workflow)
    members = await service.read_views([m.id for m in workflow.everyone], follow_parent=False)
    now = now_ms()
    step = aggregate(
        workflow, record, members, now, tool=service.tools.get(record.tool), cancel_grace_ms=service.grace_ms
    )
    for member_id in step.cancel:
        await service.cancel(member_id, None, channel=record.task_id)
    if step.launch_merge is not None and await service.store.claim_merge(record.task_id, now):
        check_at = service.first_check_ms(now)
        if check_at is not None and workflow.merge is not None:
            await service.store.watch_sent(workflow.merge.id, check_at)  # before it is sent: see after_member
        app, parent_id, (results, failed) = service.app, record.task_id, step.launch_merge
        await anyio.to_thread.run_sync(lambda: launch_merge(app, parent_id, workflow, results, failed))
    shown = step.view
    if step.freeze:
        frozen = await service.store.freeze(record.task_id, shown.to_json())
        if frozen is None:
            return None
        shown = TaskView.from_frozen(frozen)
    return None if expired(record, shown, now) else (record, shown)


async def answer(service: Members, record: TaskRecord, view: TaskView, responses: Mapping[str, Any]) -> Answered:
    """Answers to a workflow's questions, each given to the member whose label prefixes its key."""
    assert record.workflow is not None
    workflow = Workflow.from_json(record.workflow)
    by_member: dict[str, dict[str, Any]] = {}
    ignored: list[str] = []
    for key, response in responses.items():
        split = split_member_key(key)
        member = None if split is None else workflow.by_label(split[0])
        if split is None or member is None or key not in (view.input_requests or {}):
            ignored.append(key)
        else:
            by_member.setdefault(member.label, {})[split[1]] = response
    outcome = Answered(ignored=sorted(ignored), still_open=sorted(view.input_requests or {}))
    for label, answers in by_member.items():
        member = workflow.by_label(label)
        found = None if member is None else await service.read_view(member.id)
        if found is None:
            outcome.ignored.extend(member_key(label, key) for key in answers)
            continue
        done = await service.answer(found, answers)
        outcome.taken.extend(member_key(label, key) for key in done.taken)
        outcome.ignored.extend(member_key(label, key) for key in done.ignored)
        outcome.rejected.update({member_key(label, key): why for key, why in done.rejected.items()})
    outcome.still_open[:] = [key for key in outcome.still_open if key not in outcome.taken]
    return outcome
