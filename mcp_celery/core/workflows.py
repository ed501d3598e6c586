"""A workflow's state, from its members' records: what the one MCP task shows, and what must happen next.

Pure (tier 1: no celery, no redis). A tool's job may hand its task over to a Celery canvas
(`JobContext.run_workflow`): a group of members run in parallel (optionally followed by a merge
step that gets their results) or a chain of steps. Each member is an ordinary Celery task with a
record of its own (`parent` names the MCP task), so its heartbeat, cancel, questions, outcome and
lost worker are handled as for any job. The MCP task's record holds the workflow (`Workflow`), and
its view is computed here from the members' views: the worker that ends a member and any server
that reads the task call the same `aggregate`, so either may take the step it calls for (freeze
the task's end, cancel the other members, launch the merge), each a check-and-set in Redis.

Keys of members' questions are prefixed with the member's label (`train_model-2/elicit-1`), so
they stay unique over the task's life; an answer under a prefixed key goes to that member.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from mcp_celery.core.status import TaskView, with_artifacts
from mcp_celery.protocol import INTERNAL_ERROR, QUEUED_MESSAGE, call_tool_result
from mcp_celery.store.schema import TaskRecord

__all__ = [
    "FailurePolicy",
    "Member",
    "MemberStatus",
    "Next",
    "Workflow",
    "WorkflowKind",
    "WorkflowSummary",
    "aggregate",
    "member_key",
    "split_member_key",
]

#: "fail": the first member that fails fails the workflow, and the others are cancelled;
#: "partial": the merge step (or the result) gets the members that succeeded, and says which failed.
FailurePolicy = Literal["fail", "partial"]
WorkflowKind = Literal["group", "chain"]
#: The separator between a member's label and its own input request key.
KEY_SEPARATOR = "/"


@dataclass(frozen=True)
class Member:
    """One Celery task of a workflow: its task id, a label unique in the workflow, its Celery task name."""

    id: str
    label: str
    name: str


@dataclass(frozen=True)
class Workflow:
    """A workflow as its MCP task's record holds it (JSON in the `workflow` field)."""

    kind: WorkflowKind
    members: tuple[Member, ...]
    failure: FailurePolicy = "fail"
    merge: Member | None = None
    #: The merge step's Celery signature (a dict, as Celery serializes one), launched once the members end.
    merge_signature: dict[str, Any] | None = None

    @property
    def everyone(self) -> tuple[Member, ...]:
        return (*self.members, *((self.merge,) if self.merge is not None else ()))

    def by_label(self, label: str) -> Member | None:
        return next((m for m in self.everyone if m.label == label), None)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "members": [vars(m) for m in self.members],
                "failure": self.failure,
                "merge": None if self.merge is None else vars(self.merge),
                "mergeSignature": self.merge_signature,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Workflow:
        raw = json.loads(text)
        merge = raw.get("merge")
        return cls(
            kind=raw["kind"],
            members=tuple(Member(**m) for m in raw["members"]),
            failure=raw.get("failure", "fail"),
            merge=None if merge is None else Member(**merge),
            merge_signature=raw.get("mergeSignature"),
        )


@dataclass(frozen=True)
class MemberStatus:
    """What a summary function sees of one member."""

    label: str
    name: str
    status: str
    status_message: str | None
    #: The member's return value once it completed (its Celery result, JSON-ready), else None.
    result: Any = None


#: A tool's own words for a running workflow, from its members (None: the default words).
WorkflowSummary = Callable[[Sequence[MemberStatus]], str | None]


class WorkflowTool(Protocol):
    """What `aggregate` reads of the MCP task's tool (`mcp_celery.core.tools.ToolSpec`)."""

    @property
    def structured(self) -> bool: ...  # it declares an output schema: its result carries structuredContent

    @property
    def workflow_summary(self) -> WorkflowSummary | None: ...


@dataclass(frozen=True)
class Next:
    """The MCP task's view now, and the step that takes it further (each one done at most once)."""

    view: TaskView
    #: Freeze `view` as the task's end.
    freeze: bool = False
    #: Members to cancel (the workflow failed or was cancelled).
    cancel: tuple[str, ...] = ()
    #: Launch the merge step with these results (of the members that succeeded) and failures.
    launch_merge: tuple[list[Any], list[dict[str, Any]]] | None = None


def member_key(label: str, key: str) -> str:
    """A member's input request key as the MCP task shows it."""
    return f"{label}{KEY_SEPARATOR}{key}"


def split_member_key(key: str) -> tuple[str, str] | None:
    """(label, the member's own key) of a prefixed key; None for a key of no member."""
    label, sep, own = key.partition(KEY_SEPARATOR)
    return (label, own) if sep and label and own else None


def aggregate(
    workflow: Workflow,
    parent: TaskRecord,
    members: Mapping[str, tuple[TaskRecord, TaskView]],
    now_ms: int,
    *,
    tool: WorkflowTool | None,
    cancel_grace_ms: int = 0,
) -> Next:
    """The MCP task's view from its members' (by member id; a missing one has expired), and the next step.

    `tool`: the MCP task's tool (None: no longer registered), whose options shape the result and words.
    """
    structured = tool is not None and tool.structured
    summary = None if tool is None else tool.workflow_summary
    header = [(m, members.get(m.id)) for m in workflow.members]
    merge = None if workflow.merge is None else members.get(workflow.merge.id)
    updated = max([parent.updated_ms or parent.created_ms, *(v.updated_ms for _, v in members.values())])
    live = tuple(m.id for m in workflow.everyone if (found := members.get(m.id)) is not None and not found[1].terminal)
    if parent.cancel_ms is not None:
        return _cancelling(workflow, live, updated, now_ms >= parent.cancel_ms + cancel_grace_ms)
    failed = [(m, found) for m, found in header if found is None or _failed(found[1])]
    if failed and (workflow.failure == "fail" or workflow.kind == "chain"):
        # A member that failed is named before one cancelled: the others are cancelled because one
        # failed, and a reader that comes while those cancels are still going out must name the same one.
        member, found = min(failed, key=lambda pair: pair[1] is not None and pair[1][1].status == "cancelled")
        return _failure(f"member {member.label} ({member.name})", found, live, updated)
    if workflow.merge is not None and merge is not None and _failed(merge[1]):
        return _failure(f"the merge step {workflow.merge.label} ({workflow.merge.name})", merge, live, updated)
    done = all(found is not None and found[1].terminal for _, found in header)
    finished = _finished(workflow, header, merge, structured, updated) if done else None
    if finished is not None and finished.view.result is not None:
        # The members' artifacts are the task's (`worker.execution`): linked after the result, as a job's are.
        return replace(finished, view=replace(finished.view, result=with_artifacts(finished.view.result, parent)))
    if finished is not None:
        return finished
    waiting = _questions(workflow, members)
    if waiting:
        label = split_member_key(next(iter(waiting)))
        message = f"waiting for input ({label[0] if label else 'a member'})"
        return Next(TaskView("input_required", updated, message, input_requests=waiting))
    message = _words(workflow, header, merge, summary)
    return Next(TaskView("working", updated, message))


def _failed(view: TaskView) -> bool:
    """A member failed: a JSON-RPC error, a tool error (an exception in the task), or cancelled on its own."""
    if view.status in ("failed", "cancelled"):
        return True
    return view.status == "completed" and bool((view.result or {}).get("isError"))


def _cancelling(workflow: Workflow, live: tuple[str, ...], updated: int, grace_over: bool) -> Next:
    if not live:
        return Next(TaskView("cancelled", updated, "cancelled"), freeze=True)
    if grace_over:  # said as a single job's is (status.task_view): its workers may still be busy with it
        message = f"cancelled; {len(live)} of {len(workflow.everyone)} members did not stop within the grace period"
        return Next(TaskView("cancelled", updated, message), freeze=True, cancel=live)
    return Next(
        TaskView("working", updated, f"cancelling {len(live)} of {len(workflow.everyone)} members"), cancel=live
    )


def _failure(who: str, found: tuple[TaskRecord, TaskView] | None, live: tuple[str, ...], updated: int) -> Next:
    if found is None:
        reason = "its record has expired"
    else:
        view = found[1]
        reason = (view.error or {}).get("message") or view.status_message or _error_text(view.result) or view.status
    message = f"{who} failed: {reason}"
    error = {"code": INTERNAL_ERROR, "message": message}
    return Next(TaskView("failed", updated, message, error=error), freeze=True, cancel=live)


def _error_text(result: Mapping[str, Any] | None) -> str:
    content = (result or {}).get("content") or []
    return " ".join(str(block.get("text", "")) for block in content if isinstance(block, Mapping)).strip()


def _value(record: TaskRecord) -> Any:
    """A completed member's return value, as its job stored it (JSON-ready)."""
    return (record.outcome or {}).get("result")


def _finished(
    workflow: Workflow,
    header: list[tuple[Member, tuple[TaskRecord, TaskView] | None]],
    merge: tuple[TaskRecord, TaskView] | None,
    structured: bool,
    updated: int,
) -> Next | None:
    """Every member has ended: the result, or the merge step to launch or to wait for."""
    survivors = [_value(found[0]) for _, found in header if found is not None and not _failed(found[1])]
    failures = [
        {"member": m.label, "task": m.name, "error": _failure(m.label, found, (), updated).view.status_message}
        for m, found in header
        if found is None or _failed(found[1])
    ]
    if workflow.kind == "chain":
        last = header[-1][1]
        assert last is not None  # a chain that failed returned earlier
        return _completed(_value(last[0]), structured, updated)
    if workflow.merge is None:
        return _completed({"results": survivors, "failed": failures}, structured, updated)
    if merge is None:
        return None  # the merge step's record has expired: nothing to follow (the freeze below never comes)
    record, view = merge
    if view.terminal:
        return _completed(_value(record), structured, updated)
    if record.alive_until_ms is None and record.taken_until_ms is None and not record.job:
        # Not started: launch it (whoever launches first; the record says so, see Keys).
        return Next(TaskView("working", updated, "merging the results"), launch_merge=(survivors, failures))
    return None


def _completed(value: Any, structured: bool, updated: int) -> Next:
    return Next(TaskView("completed", updated, result=call_tool_result(value, structured=structured)), freeze=True)


def _questions(workflow: Workflow, members: Mapping[str, tuple[TaskRecord, TaskView]]) -> dict[str, Any]:
    waiting: dict[str, Any] = {}
    for member in workflow.everyone:
        found = members.get(member.id)
        if found is not None and found[1].status == "input_required":
            for key, request in (found[1].input_requests or {}).items():
                waiting[member_key(member.label, key)] = request
    return waiting


def _words(
    workflow: Workflow,
    header: list[tuple[Member, tuple[TaskRecord, TaskView] | None]],
    merge: tuple[TaskRecord, TaskView] | None,
    summary: WorkflowSummary | None,
) -> str:
    """`6/8 done, 1 running, 1 failed; train_model-3: epoch 4/10`, or the tool's own words."""
    statuses = [
        MemberStatus(
            m.label,
            m.name,
            "expired" if found is None else found[1].status,
            None if found is None else found[1].status_message,
            None if found is None or found[1].status != "completed" else _value(found[0]),
        )
        for m, found in header
    ]
    own = summary(statuses) if summary is not None else None
    if own:
        return own
    done = sum(s.status == "completed" for s in statuses)
    running = [s for s in statuses if s.status == "working" and s.status_message not in (None, QUEUED_MESSAGE)]
    failed = sum(s.status in ("failed", "cancelled", "expired") for s in statuses)
    words = f"{done}/{len(statuses)} done, {len(running)} running" + (f", {failed} failed" if failed else "")
    if merge is not None and merge[1].status == "working" and merge[1].status_message not in (None, QUEUED_MESSAGE):
        return f"{words}; merging: {merge[1].status_message}"
    if running:
        words += f"; {running[-1].label}: {running[-1].status_message}"
    return words
