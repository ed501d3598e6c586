"""Approvals as the page sees them: one found by its id, the list waiting for a person, a decision.

Server tier, engine floor. A thin layer over the task service: an approval is an input request of
a task, so its state is the task's (`TaskService.read_view`, the one status table), and a decision
is an answer given through `TaskService.answer(..., decided_by=principal)`, where the approver
check, the validation and the resume of a parked job happen as for every answer. The index the
worker writes (`Keys.approval`, `Keys.approvals`) only says which task and request an id stands for.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

from mcp_celery import logs
from mcp_celery.core.approvals import Approval, approval_of, decision, may_decide
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.service import Found, TaskService

__all__ = ["ApprovalState", "Decided", "decide", "find", "pending_for"]

logger = logging.getLogger(__name__)

#: What an approval id looks like (`new_approval_id`); anything else is not looked up.
_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")

State = Literal["open", "decided", "withdrawn", "closed"]
#: What became of a decision: made, refused (with why), or too late (decided, withdrawn, closed).
Decided = tuple[Literal["decided", "refused", "too late"], str]


@dataclass(frozen=True)
class ApprovalState:
    """One approval now: the request as asked, its task, and whether it is open, decided or withdrawn."""

    approval_id: str
    task_id: str
    key: str
    tool: str
    request: dict[str, Any]
    asked_ms: int
    state: State
    decision: Approval | None
    found: Found | None

    @property
    def approval(self) -> dict[str, Any]:
        return approval_of(self.request) or {}

    @property
    def message(self) -> str:
        return str(self.request["params"]["message"])

    @property
    def requester(self) -> str:
        return str(self.approval.get("requester", ""))

    def refusal(self, principal: str) -> str | None:
        """Why `principal` may not decide this approval (shown on the page, as a 403), or None."""
        return may_decide(self.approval, principal)


async def find(service: TaskService, approval_id: str) -> ApprovalState | None:
    """The approval with this id, or None when the id is unknown, malformed or its task expired."""
    if not _ID.fullmatch(approval_id):
        return None
    where = await service.store.approval(approval_id)
    if where is None:
        return None
    task_id, key, request = where
    found = await service.read_view(task_id)
    return await _state(service, approval_id, task_id, key, request, found)


async def _state(
    service: TaskService, approval_id: str, task_id: str, key: str, request: dict[str, Any], found: Found | None
) -> ApprovalState:
    record, view = found if found is not None else (None, None)
    answer = await service.store.stored_answer(task_id, key)
    state: State = "closed"
    if answer is not None:
        state = "decided"
    elif view is not None and view.status == "input_required" and record is not None and key in record.inputs:
        state = "open"
    elif view is not None and view.status == "cancelled":
        state = "withdrawn"
    return ApprovalState(
        approval_id=approval_id,
        task_id=task_id,
        key=key,
        tool="" if record is None else record.tool,
        request=request,
        asked_ms=0 if record is None else (record.updated_ms or record.created_ms),
        state=state,
        decision=None if answer is None else Approval.from_answer(answer),
        found=found,
    )


async def pending_for(service: TaskService, principal: str) -> list[ApprovalState]:
    """The open approvals `principal` may decide, oldest first; ids that are over leave the index."""
    pending, over = [], []
    for approval_id in await service.store.approval_ids():
        state = await find(service, approval_id)
        if state is None or state.state in ("decided", "withdrawn") or (state.found and state.found[1].terminal):
            over.append(approval_id)
        elif state.state == "open" and state.refusal(principal) is None:
            pending.append(state)
    await service.store.forget_approvals(over)
    return pending


async def decide(
    service: TaskService, state: ApprovalState, principal: str, *, approved: bool, comment: str
) -> Decided:
    """Decide an open approval as `principal`, through the service's answer path (which checks who decides)."""
    if state.state != "open" or state.found is None:
        return "too late", state.state
    answer = decision(approved=approved, by=principal, at_ms=now_ms(), comment=comment)
    answered = await service.answer(state.found, {state.key: answer}, decided_by=principal)
    if state.key in answered.rejected:
        return "refused", answered.rejected[state.key]
    if state.key not in answered.taken:
        return "too late", "decided"
    verdict = "approved" if approved else "denied"
    fields = logs.task_fields(state.task_id, state.tool, principal=principal, event=verdict)
    logger.info("task %s: %s on the approval page", state.task_id, verdict, extra=fields)
    await service.store.forget_approvals([state.approval_id])
    return "decided", verdict
