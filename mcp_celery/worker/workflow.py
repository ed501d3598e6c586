"""Workflows on the worker side: a job hands its task over to a Celery canvas, and members report back.

Worker tier. `JobContext.run_workflow` calls `start`: it gives every member of the canvas (a group's
tasks, a chain's steps, a merge step) a task id and a record of its own naming the MCP task as its
parent, records the workflow in the MCP task's record (LAUNCH: refused if the task was cancelled
meanwhile), sends the canvas, and ends the job (`WorkflowStarted`): its worker slot is free while
the members run, on any worker. Each member runs through `run_job` like a tool (heartbeat, cancel,
questions, outcome); its events go to the MCP task's channel, so listeners of that task hear them.

When a member ends, `after_member` reads the workflow and its members and takes the step that
`mcp_celery.core.workflows.aggregate` calls for: freeze the task's end, cancel the other members, or
launch the merge step (whoever claims it first: a server that reads the task does the same).
Members are ordinary Celery tasks (their own queues, retries, rate limits); Celery records the MCP
task's Celery task as their parent (`parent_id`, `root_id`), so Flower shows them as its children.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

from celery import Celery, Signature, Task, chain, chord, group
from celery.canvas import _chain  # what a chain is an instance of (`chain(...)` builds one)

from mcp_celery.core.canvas import FAILED_HEADER, PARENT_HEADER, launch_merge, show_revoked
from mcp_celery.core.status import CANCELLED_BEFORE_START, CANCELLED_WHILE_PARKED, TaskView, task_view
from mcp_celery.core.tools import redelivered_on_loss, registry
from mcp_celery.core.workflows import FailurePolicy, Member, Workflow, WorkflowKind, aggregate
from mcp_celery.errors import JobSignal, TaskCancelled
from mcp_celery.protocol import now_ms
from mcp_celery.store.schema import TaskRecord, member_id
from mcp_celery.store.sync import SyncStore

__all__ = ["FAILED_HEADER", "PARENT_HEADER", "WorkflowStarted", "after_member", "start"]

logger = logging.getLogger(__name__)


class WorkflowStarted(JobSignal):
    """Raised by `run_workflow` once the workflow is sent: the job ends, its task follows the workflow.

    A `JobSignal`, so that a job's own `except Exception:` cannot swallow it and carry on.
    """

    def __init__(self, kind: str, members: int) -> None:
        super().__init__(f"handed over to a {kind} of {members} members")
        self.kind = kind
        self.members = members


def start(
    task: Task[Any, Any],
    store: SyncStore,
    record: TaskRecord | None,
    work: Any,
    *,
    merge: Signature[Any] | None,
    on_failure: FailurePolicy,
    check_after_s: float | None,
) -> WorkflowStarted:
    """Create the members' records, hand the task over and send the canvas; returns what to raise.
    A job not started through MCP (`record` None) has Celery's own replace() run the canvas instead.

    Raises:
        ValueError: `work` is not a group, chord, chain, or a list of signatures, or nests one in
            another, or this job is a workflow's member itself.
        TaskCancelled: the task was cancelled before the workflow could be handed it.
    """
    if record is not None and record.parent is not None:
        raise ValueError("a workflow's member cannot start a workflow of its own (nested workflows)")
    if record is None:
        task.replace(chord(work, merge) if merge is not None else work)  # it raises
        raise AssertionError("Task.replace returned")
    kind, signatures, merge = _members_of(work, merge)
    parent = record.task_id
    members = [_prepare(sig, f"{_short(str(sig.task))}-{i + 1}", parent) for i, sig in enumerate(signatures)]
    merge_member = None if merge is None else _prepare(merge, "merge", parent)
    workflow = Workflow(
        kind=kind,
        members=tuple(m for m, _ in members),
        failure=on_failure,
        merge=None if merge_member is None else merge_member[0],
        merge_signature=None if merge_member is None else dict(merge_member[1]),
    )
    # Only the messages sent now are looked for if their job does not start: a chain's later steps and
    # the merge step are sent when their turn comes (the merge is watched from then).
    sent_now = [m for m, _ in (members if kind == "group" else members[:1])]
    check_at = None if check_after_s is None else now_ms() + int(check_after_s * 1000)
    store.create_members(record, [(m.id, m.name) for m in sent_now], check_at)
    later = [m for m, _ in members if m not in sent_now] + ([merge_member[0]] if merge_member else [])
    store.create_members(record, [(m.id, m.name) for m in later], None)
    if not store.launch(parent, workflow.to_json()):
        raise TaskCancelled(parent)  # the same exception a checkpoint raises: the members never run
    canvas = group([s for _, s in members]) if kind == "group" else chain(*[s for _, s in members])
    canvas.apply_async()
    return WorkflowStarted(kind, len(members))


def _members_of(
    work: Any, merge: Signature[Any] | None
) -> tuple[WorkflowKind, list[Signature[Any]], Signature[Any] | None]:
    if isinstance(work, chord):
        if merge is not None:
            raise ValueError("a chord has its merge step already (its body): pass merge= with a group instead")
        return "group", _flat(work.tasks), work.body
    if isinstance(work, group):
        return "group", _flat(work.tasks), merge
    if isinstance(work, _chain):
        if merge is not None:
            raise ValueError("a chain's last step is its result: merge= goes with a group")
        return "chain", _flat(work.tasks), None
    if isinstance(work, Signature):
        return "group", [work], merge
    if isinstance(work, Sequence) and not isinstance(work, str | bytes):
        return "group", _flat(work), merge
    raise ValueError(f"run_workflow takes a group, chord, chain or a list of signatures, not {type(work).__name__}")


def _flat(tasks: Any) -> list[Signature[Any]]:
    signatures = list(tasks.tasks if isinstance(tasks, group) else tasks)
    for sig in signatures:
        if isinstance(sig, group | chord | _chain) or not isinstance(sig, Signature):
            raise ValueError(
                "a workflow's members are task signatures: nested groups, chords or chains are not supported"
            )
    if not signatures:
        raise ValueError("a workflow needs at least one member")
    return signatures


def _prepare(sig: Signature[Any], label: str, parent: str) -> tuple[Member, Signature[Any]]:
    """The member's id (frozen into its signature) and its header naming the MCP task."""
    if sig.options.get("task_id"):
        raise ValueError(
            f"a workflow member's task id is mcp-celery's to choose (its records share the MCP task's, to stay "
            f"in one slot of a Redis Cluster): leave task_id unset on {sig.task} (do not freeze the canvas)"
        )
    own_id = member_id(parent)
    headers = {**(sig.options.get("headers") or {}), PARENT_HEADER: parent}
    sig.set(task_id=own_id, headers=headers)
    return Member(id=own_id, label=label, name=str(sig.task)), sig


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def after_member(app: Celery, store: SyncStore, parent_id: str, *, grace_ms: int, check_after_s: float | None) -> None:
    """A member has ended: take the step the workflow calls for now (see `aggregate`).

    `check_after_s` (None: the broker cannot be looked into): how long after a merge step or a chain's
    next step is sent its message is looked for if no job has started (`mcp_celery.server.engine.reaper`);
    each is watched before it is sent, so that a worker lost in between leaves it watched too.
    """
    (parent,) = store.read_records([parent_id])
    if parent is None or parent.workflow is None or parent.final is not None:
        return
    workflow = Workflow.from_json(parent.workflow)
    records = store.read_records([m.id for m in workflow.everyone])

    def again(name: str) -> bool:
        return redelivered_on_loss(app.tasks.get(name))

    now = now_ms()
    views = {
        r.task_id: (r, task_view(r, now, structured=False, grace_ms=grace_ms, redelivered_on_loss=again(r.tool)))
        for r in records
        if r is not None
    }
    step = aggregate(workflow, parent, views, now, tool=registry(app).get(parent.tool), cancel_grace_ms=grace_ms)
    if step.cancel:
        before_start = TaskView("cancelled", now, CANCELLED_BEFORE_START).to_json()
        while_parked = TaskView("cancelled", now, CANCELLED_WHILE_PARKED).to_json()
        parked = store.cancel_members(step.cancel, parent_id, before_start, while_parked)
        app.control.revoke(list(step.cancel))
        for member in parked:  # no worker runs these to say so
            show_revoked(app, member, CANCELLED_WHILE_PARKED)
    if step.freeze:
        store.freeze(parent_id, step.view.to_json())
    check_at = None if check_after_s is None else now + int(check_after_s * 1000)
    if step.launch_merge is not None and store.claim_merge(parent_id):
        if check_at is not None and workflow.merge is not None:
            store.watch_sent(workflow.merge.id, check_at)
        launch_merge(app, parent.task_id, workflow, *step.launch_merge)
    following = _next_step(workflow, views) if check_at is not None and not step.freeze else None
    if following is not None and check_at is not None:
        store.watch_sent(following, check_at)  # Celery sends it once this job returns


def _next_step(workflow: Workflow, views: dict[str, tuple[TaskRecord, TaskView]]) -> str | None:
    """A chain's step that Celery sends next: the first not started, right after a completed one."""
    if workflow.kind != "chain":
        return None
    for before, step in itertools.pairwise(workflow.members):
        done, found = views.get(before.id), views.get(step.id)
        if done is not None and done[1].status == "completed" and found is not None:
            record = found[0]
            if record.alive_until_ms is None and record.final is None and record.outcome is None:
                return step.id
    return None
