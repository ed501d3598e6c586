"""The approval policy's gate: a call of a tool the policy names waits for a person before its job is queued.

Server tier, engine floor. The task service calls it where a job's message would be sent: on
`create`, a call of a tool the policy names (`policy`) is held instead (`hold`): its record is
written with the approval open, the same URL-mode request a job's `ctx.approve` asks
(`mcp_celery.core.approvals`), indexed for the same page, and the job's message kept in the record
unsent, so no worker is held and the job cannot start early. The page's decision is an answer like
any other (`engine.approvals.decide` -> `TaskService.answer`), and the ANSWER script hands the kept
message to the one answer that closes the request; `TaskService.resume` then asks `release`, which
checks what the approval is bound to (the principal who called, the tool, the digest of the canonical
arguments, `mcp_celery.core.calls.call_digest`), that it came within its window and that the policy
as it reads now still lets that person approve it: the job is queued once, or the task completes
with `isError` and "not run: denied by NAME" (or why else it did not run). An approval nobody
decides in time ends the same way, by the reaper (`timed_out`).

A held task is parked before its first run (`FIELD.PARKED`, `FIELD.RESUME`), so what holds for a
parked job holds for it: a cancel ends it at once, the reaper does not take it for lost, a restart
loses nothing (it is all in Redis), and a server lost between the decision and the message is
covered by the reaper, which finds the message nowhere and asks `release` again (Redis broker).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from kombu.utils import json as kombu_json
from mcp.shared.exceptions import MCPError

from mcp_celery import logs, tracing
from mcp_celery.core.approvals import (
    Approval,
    approval_of,
    approval_request,
    may_decide,
    new_approval_id,
    page_url,
    redacted_arguments,
)
from mcp_celery.core.calls import call_digest
from mcp_celery.core.canvas import show_revoked
from mcp_celery.core.status import TaskView
from mcp_celery.core.tools import ToolSpec
from mcp_celery.errors import ConfigurationError
from mcp_celery.protocol import INTERNAL_ERROR, now_ms
from mcp_celery.server.engine.policy import PolicyFile, Rule
from mcp_celery.settings import Settings
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.commands import publish_command
from mcp_celery.store.ended import EndedEntry
from mcp_celery.store.gated import Held, held_commands
from mcp_celery.store.schema import TaskRecord

__all__ = ["GATE_KEY", "NOT_RUN", "PolicyGate", "timed_out"]

logger = logging.getLogger(__name__)

#: The input request key of a held call's approval (a job's own are `approval-N`).
GATE_KEY = "policy-approval"
#: How the result of a held call that did not run begins.
NOT_RUN = "not run"
#: The page finds a held call's approval this long after its window closes (then "not found").
KEPT_AFTER_WINDOW_S = 86400


class PolicyGate:
    """The approval policy of one server process, and what it does to the calls it names.

    Raises (constructor):
        ConfigurationError: MCP_CELERY_APPROVAL_POLICY names a file that cannot be read or is not a
            policy (the message names the line).
    """

    def __init__(self, settings: Settings, tools: Mapping[str, ToolSpec], app: Any) -> None:
        self.settings = settings
        self.app = app
        #: Where the approval page is: MCP_CELERY_PUBLIC_URL, else what `serve --http` listens on.
        self.public_url = settings.public_url
        self.file: PolicyFile | None = None
        if settings.approval_policy:
            parameters = {name: list(spec.input_schema.get("properties") or {}) for name, spec in tools.items()}
            self.file = PolicyFile(Path(settings.approval_policy), parameters)

    def rule_for(self, tool: str) -> Rule | None:
        """The rule a call of `tool` is held by, or None (no policy, or none for it).

        Raises:
            MCPError: the policy file cannot be read now; no call runs until it can (logged with its line).
        """
        if self.file is None:
            return None
        try:
            return self.file.current().rule_for(tool)
        except ConfigurationError:
            # Not the file's path or text: a caller learns only that the operator must fix something.
            raise MCPError(
                INTERNAL_ERROR, "the server's approval policy cannot be read; no tool runs until it is fixed"
            ) from None

    def window_s(self, rule: Rule) -> float:
        """How long a call held by `rule` waits for its decision (s)."""
        return rule.timeout_s if rule.timeout_s is not None else self.settings.input_timeout_s

    def ttl_ms(self, tool: str, ttl_ms: int | None) -> int | None:
        """A new task's TTL: the deployment's, and for a call the policy holds its approval window on top.

        Raises:
            MCPError: as `rule_for`.
        """
        rule = self.rule_for(tool) if ttl_ms is not None else None
        return ttl_ms if ttl_ms is None or rule is None else ttl_ms + int(self.window_s(rule) * 1000)

    async def hold(
        self,
        store: AsyncStore,
        spec: ToolSpec,
        record: TaskRecord,
        arguments: dict[str, Any],
        rule: Rule,
        **create: Any,
    ) -> None:
        """Write the task with its approval open and its job's message kept, unsent; `create`: `AsyncStore.create`'s.

        Raises:
            MCPError: no approval page to link to (MCP_CELERY_PUBLIC_URL unset on a server without HTTP).
        """
        if not self.public_url:
            raise MCPError(
                INTERNAL_ERROR,
                f"tool {spec.name!r} needs approval (MCP_CELERY_APPROVAL_POLICY), and the approval page's link "
                "needs MCP_CELERY_PUBLIC_URL: set it to the URL of the server that serves /approvals",
            )
        window_s = self.window_s(rule)
        until_ms = record.created_ms + int(window_s * 1000)
        digest = call_digest(spec.name, arguments)
        approval_id = new_approval_id()
        held = Held(
            task_id=record.task_id,
            key=GATE_KEY,
            request=self._request(spec.name, record, arguments, rule, approval_id),
            approval_id=approval_id,
            asked_ms=record.created_ms,
            until_ms=until_ms,
            signature=_signature(spec, record.task_id, arguments),
            gate={"rule": rule.pattern, "digest": digest, "approval": approval_id, "until": until_ms},
        )
        record_s = int(window_s) + 1 + store.lifetimes.live_s
        then = held_commands(
            store.keys,
            publish_command(store.redis),
            held,
            record_s=record_s,
            index_s=int(window_s) + KEPT_AFTER_WINDOW_S,
        )
        await store.create(record, check_at_ms=held.until_ms, then=then, **create)
        fields = logs.task_fields(record.task_id, spec.name, principal=record.owner, status="input_required")
        fields["event"] = "held"
        logger.info(
            "task %s: held for approval (policy rule %r); nothing queued", record.task_id, rule.pattern, extra=fields
        )

    def _request(
        self, tool: str, record: TaskRecord, arguments: Mapping[str, Any], rule: Rule, approval_id: str
    ) -> dict[str, Any]:
        shown = redacted_arguments(arguments)
        return approval_request(
            rule.message_for(tool, shown),
            page_url(str(self.public_url), approval_id),
            approval_id=approval_id,
            approvers=rule.approvers,
            four_eyes=rule.four_eyes,
            details={"approval policy": rule.pattern, "call sha256": call_digest(tool, arguments)},
            arguments=shown,
            requester=record.owner,
        )

    @staticmethod
    def holds(record: TaskRecord) -> bool:
        """Whether `record` is a held call whose job was never queued (its decision is still to be applied)."""
        return record.gate is not None and record.progress is None and record.outcome is None

    async def release(self, store: AsyncStore, record: TaskRecord, signature: str) -> bool:
        """Apply the decision on a held call: True to queue its job (the caller sends `signature`), else
        False once the task has completed saying why the tool did not run."""
        answer = await store.stored_answer(record.task_id, GATE_KEY)
        decided = None if answer is None else Approval.from_answer(answer)
        if decided is None:
            await _not_run(store, self.app, record, now_ms(), None, "no decision was recorded")
            return False
        if not decided.approved:
            said = f": {decided.comment}" if decided.comment else ""
            await _not_run(store, self.app, record, now_ms(), decided, said)
            return False
        shown = await store.approval(str((record.gate or {}).get("approval")))  # the request the approver saw
        if (but := self._but(record, decided, signature, None if shown is None else shown[2])) is not None:
            await _not_run(store, self.app, record, now_ms(), decided, f", but {but}")
            return False
        await _tell(self.app, record, "approved", decided, "")
        return True

    def _but(
        self, record: TaskRecord, decided: Approval, signature: str, shown: Mapping[str, Any] | None
    ) -> str | None:
        """Why an approved call must not run after all, or None: the request the approver saw (`shown`, as
        the page's index keeps it) names this very call (tool, caller, call digest), the decision came in
        time, and the policy as it reads now still lets the decider approve it."""
        gate, seen = record.gate or {}, (approval_of(shown) if shown is not None else None) or {}
        digest = call_digest(record.tool, kombu_json.loads(signature).get("kwargs") or {})
        if digest != gate.get("digest") or digest != (seen.get("details") or {}).get("call sha256"):
            return "not for these arguments"
        if seen.get("requester") != record.owner:
            return "for another caller"
        if int(decided.at.timestamp() * 1000) > int(gate.get("until") or 0):
            return "after the approval's window closed"
        try:
            rule = self.rule_for(record.tool)
        except MCPError:
            return "the approval policy could not be read to confirm it"
        refused = None if rule is None else may_decide(_as_approval(rule, record.owner), decided.by)
        return None if refused is None else f"the policy as it reads now does not let them ({refused})"


def _as_approval(rule: Rule, requester: str) -> dict[str, Any]:
    """A rule as the approval `may_decide` judges (`mcp_celery.core.approvals.approval_request`'s shape)."""
    return {"approvers": sorted(rule.approvers), "fourEyes": rule.four_eyes, "requester": requester}


def _signature(spec: ToolSpec, task_id: str, arguments: dict[str, Any]) -> str:
    """The job's message as `TaskService.create` would send it, as a Celery signature (kombu JSON)."""
    options: dict[str, Any] = {"task_id": task_id, "argsrepr": spec.argsrepr}
    if trace_headers := tracing.message_headers():
        options["headers"] = trace_headers
    return str(kombu_json.dumps(dict(spec.celery_task.signature((), kwargs=arguments, options=options))))


async def timed_out(store: AsyncStore, app: Any, record: TaskRecord, until_ms: int) -> None:
    """End a held call nobody decided within its window (the reaper's, once the window is over)."""
    request = record.inputs.get(GATE_KEY)
    approval = (approval_of(request) if isinstance(request, Mapping) else None) or {}
    approvers = ", ".join(approval.get("approvers") or []) or "?"
    window_s = max(until_ms - record.created_ms, 0) / 1000
    await _not_run(store, app, record, until_ms, None, f"no decision within {window_s:g} s (approvers: {approvers})")


async def _not_run(
    store: AsyncStore, app: Any, record: TaskRecord, at_ms: int, decided: Approval | None, why: str
) -> None:
    """Complete the held task with `isError` and "not run: denied by NAME: WHY" ("not run: WHY" without a
    decision), and tell the log, Celery's backend and Flower (with the decider's name as a digest)."""
    verdict = "none" if decided is None else ("approved" if decided.approved else "denied")
    text = f"{NOT_RUN}: {why}" if decided is None else f"{NOT_RUN}: {verdict} by {decided.by}{why}"
    pattern = (record.gate or {}).get("rule", "?")
    detail = (
        f"{text}\nTool {record.tool} did not run: the approval policy (rule {pattern!r}) holds its calls for approval."
    )
    result = {"resultType": "complete", "content": [{"type": "text", "text": detail}], "isError": True}
    view = TaskView("completed", at_ms, text, result=result)
    ended = EndedEntry(record.task_id, record.tool, "completed", record.created_ms, at_ms, tool_error=True, reason=text)
    await store.freeze(record.task_id, view.to_json(), ended=ended)
    await store.forget_live([record.task_id])
    shown = await _tell(app, record, "timed out" if decided is None else verdict, decided, NOT_RUN + ": ")
    # Celery never saw the job: its backend and Flower learn that it will not run, as a parked job's cancel says.
    await anyio.to_thread.run_sync(lambda: show_revoked(app, record.task_id, shown))


async def _tell(app: Any, record: TaskRecord, verdict: str, decided: Approval | None, prefix: str) -> str:
    """The decision in the log and as Flower's `task-approval` event, as a job's approval says it: the
    decider's name as a digest, no comment. Returns what they said."""
    said = prefix + (verdict if decided is None else f"{verdict} by {logs.principal_digest(decided.by)}")
    fields = logs.task_fields(record.task_id, record.tool, principal=record.owner, event=verdict)
    logger.info("task %s: %s (approval policy)", record.task_id, said, extra=fields)
    event = {"uuid": record.task_id, "approved": verdict == "approved" and not prefix, "result": said, "policy": True}
    if decided is not None:
        event["by"] = logs.principal_digest(decided.by)
    await anyio.to_thread.run_sync(lambda: _send_event(app, event))
    return said


def _send_event(app: Any, event: dict[str, Any]) -> None:
    """Flower's event; never raises (the decision is applied already; only Flower's view would lag)."""
    try:
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send("task-approval", **event)
    except Exception:  # noqa: BLE001
        logger.warning("task %s: could not send the task-approval event", event["uuid"], exc_info=True)
