"""`tools/call` from a request that does not declare the tasks extension: the plain call.

Server tier, a surface over the task service. Most MCP hosts do not speak the extension yet and
give a call about 60 s, so a call of an optional tool creates an ordinary task (the same record,
owner, answers, events and Flower view) and waits for it up to its inline window:

* a job that ends within the window answers with its own result, as a synchronous call would;
* each new statusMessage goes out as `notifications/progress` when the request carries a
  progress token (hosts that reset their timeout on progress then keep waiting);
* a job that asks questions gets its answers without a model round trip where the client can
  give them: a session of the initialize era that declared the capability is asked with ordinary
  server-to-client requests; a 2026-07-28 request that declared it gets an MRTR round whose
  retry answers the running job and waits again; a question the caller can answer only through
  `task_respond` ends the wait at once, with the task handle and the question in words;
* past the window nothing is cancelled: the call answers with a task handle, in words for the
  model (which tool to call next) and in `_meta` for programs, and the lifecycle tools
  (`lifecycle`) reach the task from any replica, also after a restart, while its TTL lasts.

`task_mode="forbidden"` tools, and every call when `MCP_CELERY_TOOL_FALLBACK` is false, run
synchronously instead: the call waits `sync_timeout_s` and then cancels the job.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import anyio
import pydantic
from anyio.abc import TaskGroup
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery.core.status import TaskView
from mcp_celery.core.tools import ToolSpec
from mcp_celery.inputs import missing_capability, sampling_answer_model
from mcp_celery.protocol import (
    INTERNAL_ERROR,
    QUEUED_MESSAGE,
    now_ms,
    tool_error_result,
)
from mcp_celery.server.engine.events import Watcher
from mcp_celery.server.engine.service import Found, TaskService
from mcp_celery.server.plain import resume, windows, wording
from mcp_celery.server.plain.handle import handle_result, with_task_handle
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.store.output import last_lines

__all__ = ["call", "listed_tool", "resume_call", "window_s"]

logger = logging.getLogger(__name__)

#: Fewest seconds between two progress notifications (a job may report in a tight loop).
PROGRESS_GAP_S = 0.25
#: A progress notification at least this often while the job is silent, for hosts that reset their
#: timeout on progress (the TypeScript SDK's default timeout is 60 s).
PROGRESS_KEEPALIVE_S = 10.0


def window_s(service: TaskService, spec: ToolSpec | None, ctx: RequestContext) -> float:
    """How long a plain call of the tool waits for its job: its window, below the client's timeout (`windows`)."""
    return windows.window_s(service.settings, spec, windows.client_of(ctx))


def listed_tool(spec: ToolSpec) -> dict[str, Any]:
    """The tool as `tools/list` shows it to a request without the extension.

    A job that may still run when the window ends answers with a task handle, so an output schema
    accepts the handle too (SDK clients validate structuredContent against it).
    """
    tool = spec.to_wire()
    if spec.output_schema is not None and spec.task_mode == "optional":
        tool["outputSchema"] = with_task_handle(spec.output_schema)
    return tool


async def call(
    service: TaskService, ctx: RequestContext, spec: ToolSpec, arguments: dict[str, Any], first_answers: dict[str, Any]
) -> Any:
    """The plain call of an optional or forbidden tool (the request did not declare the extension)."""
    inline = service.settings.tool_fallback and spec.task_mode == "optional"
    record = service.new_record(
        spec,
        owner=envelope.principal(ctx),
        capabilities=envelope.client_capabilities(ctx),
        first_answers=first_answers,
        sync=not inline,
        plain=inline,
    )
    key = envelope.idempotency_key(ctx, service.settings.max_idempotency_key_length)
    # Watch before queueing: every state the job stores is published on the task's event channel.
    async with service.events.watch([record.task_id]) as watcher:
        earlier = await service.create_unless_repeated(spec, record, arguments, key)
        if earlier is None and not inline:
            return await _call_sync(service, spec, record.task_id, watcher)
        if earlier is None:
            queued = TaskView("working", record.created_ms, QUEUED_MESSAGE)
            return await _follow(service, ctx, spec, (record, queued), watcher)
    # A repeated call (its key, or the tool's dedupe window) waits on the earlier call's task as that call did.
    async with service.events.watch([earlier[0].task_id]) as watcher:
        if not inline:
            return await _call_sync(service, spec, earlier[0].task_id, watcher, read_first=True)
        return await _follow(service, ctx, spec, earlier, watcher, read_first=True)


async def resume_call(
    service: TaskService, ctx: RequestContext, spec: ToolSpec, params: types.CallToolRequestParams
) -> Any:
    """The retry of an MRTR round this module sent: answer the running job, then wait again.

    Raises:
        MCPError: -32602 for a requestState this deployment did not issue for this tool and caller,
            an expired one, or a task that no longer exists.
    """
    principal = envelope.principal(ctx)
    state = str(params.request_state)
    task_id = resume.task_of(service.state_secret, state, tool=spec.name, principal=principal, now_ms=now_ms())
    async with service.events.watch([task_id]) as watcher:
        found = await service.find(principal, task_id)
        if found is None:
            raise envelope.task_not_found()
        await service.answer(found, envelope.input_responses(params))
        return await _follow(service, ctx, spec, found, watcher, read_first=True)


async def _follow(
    service: TaskService,
    ctx: RequestContext,
    spec: ToolSpec,
    found: Found,
    watcher: Watcher,
    *,
    read_first: bool = False,
) -> Any:
    """Wait up to the inline window for the task to end; meanwhile report progress and pass questions on."""
    outcome: Any
    async with anyio.create_task_group() as questions:
        try:
            outcome = await _window(service, ctx, spec, found, watcher, questions, read_first)
        except Exception as exc:  # noqa: BLE001 - raised below, outside the group (which would wrap it)
            outcome = exc
        # Questions still out on the session stay open in the task (task_status shows them).
        questions.cancel_scope.cancel()
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def _window(
    service: TaskService,
    ctx: RequestContext,
    spec: ToolSpec,
    found: Found,
    watcher: Watcher,
    questions: TaskGroup,
    fresh: bool,
) -> Any:
    window = window_s(service, spec, ctx)
    started = anyio.current_time()
    deadline = started + window
    progress = _Progress(ctx)
    asking = _SessionQuestions.of(service, ctx)
    task_id = found[0].task_id
    while True:
        if fresh:
            latest = await service.read_view(task_id)
            if latest is None:
                raise envelope.task_not_found()
            found = latest
            view = found[1]
            if view.terminal:
                return _final(spec, view)
            if view.status == "input_required":
                round_trip = _mrtr_round(service, ctx, spec, found)
                if round_trip is not None:
                    return round_trip
                if asking is not None:
                    asking.ask(questions, found)
                if _only_task_respond(ctx, asking, view):  # waiting on would only cost the caller the window
                    return await _handle(service, ctx, spec, found, round(anyio.current_time() - started, 1))
            await progress.saw(found)
        left = deadline - anyio.current_time()
        if left <= 0:
            return await _handle(service, ctx, spec, found, window)
        fresh = bool(await watcher.changed(min(left, progress.due_in())))
        await progress.tick()


def _final(spec: ToolSpec, view: TaskView) -> Any:
    """A job that ended within the window answers as a synchronous call would."""
    if view.status == "cancelled":
        return _tool_error(spec.name, "the job was cancelled")
    if view.status == "failed":
        error = view.error or {}
        raise MCPError(int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "")), error.get("data"))
    return types.CallToolResult.model_validate(view.result)


async def _handle(
    service: TaskService, ctx: RequestContext, spec: ToolSpec, found: Found, waited_s: float
) -> types.CallToolResult:
    """The window ended with the job running: the task handle, in words, as structuredContent and in `_meta`."""
    record, view = found
    wait_s = window_s(service, spec, ctx)
    text = wording.running(record, view, waited_s, wait_s)
    output = last_lines(await service.output_of(found))
    if output:
        text += "\n" + wording.output_tail(record.task_id, output)
    guidance = wording.guidance(text, record.task_id, view, wait_s, output)
    result = handle_result(record.task_id, view.status, view.status_message, guidance)
    return types.CallToolResult.model_validate(result)


def _only_task_respond(ctx: RequestContext, asking: _SessionQuestions | None, view: TaskView) -> bool:
    """Whether the job asks something this caller can answer only through `task_respond`.

    Called after `_mrtr_round` found nothing to ask in-band: a 2026-07-28 request then has no way,
    nor has a session that cannot be sent requests; a session that can answers what it declared.
    """
    capabilities = envelope.client_capabilities(ctx)
    return any(
        asking is None or missing_capability(request, capabilities) is not None
        for request in (view.input_requests or {}).values()
    )


def _mrtr_round(service: TaskService, ctx: RequestContext, spec: ToolSpec, found: Found) -> Any:
    """The job's questions as an MRTR round, for a 2026-07-28 request that declared what they need."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None
    record, view = found
    capabilities = envelope.client_capabilities(ctx)
    answerable = {
        key: request
        for key, request in (view.input_requests or {}).items()
        if missing_capability(request, capabilities) is None
    }
    if not answerable:
        return None  # nothing it declared it can answer: the questions wait for task_respond
    expires_ms = now_ms() + int(service.settings.input_timeout_s * 1000)
    principal = envelope.principal(ctx)
    state = resume.issue(
        service.state_secret, task_id=record.task_id, tool=spec.name, principal=principal, expires_ms=expires_ms
    )
    return types.InputRequiredResult.model_validate({"inputRequests": answerable, "requestState": state})


class _SessionQuestions:
    """Passes a job's questions to a session client of the initialize era as server-to-client requests."""

    #: Each kind of input request, as the SDK sends it, with the result it expects.
    KINDS: dict[str, tuple[type[pydantic.BaseModel], type[pydantic.BaseModel]]] = {
        "elicitation/create": (types.ElicitRequest, types.ElicitResult),
        "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult),
        "roots/list": (types.ListRootsRequest, types.ListRootsResult),
    }

    @classmethod
    def kind_of(cls, request: Mapping[str, Any]) -> tuple[type[pydantic.BaseModel], type[pydantic.BaseModel]]:
        method = str(request.get("method"))
        kind, result_type = cls.KINDS[method]
        if method == "sampling/createMessage":  # with tools, the answer may hold tool_use blocks
            result_type = sampling_answer_model(request.get("params") or {})
        return kind, result_type

    def __init__(self, service: TaskService, ctx: RequestContext) -> None:
        self.service = service
        self.ctx = ctx
        self.capabilities = envelope.client_capabilities(ctx)
        self.sent: set[str] = set()

    @classmethod
    def of(cls, service: TaskService, ctx: RequestContext) -> _SessionQuestions | None:
        """None unless the request's session can be sent requests (stdio sessions of the initialize era)."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or not ctx.session.can_send_request:
            return None
        return cls(service, ctx)

    def ask(self, tg: TaskGroup, found: Found) -> None:
        """Send each outstanding request not sent yet that the client declared it can answer."""
        for key, request in (found[1].input_requests or {}).items():
            if key in self.sent or missing_capability(request, self.capabilities) is not None:
                continue
            self.sent.add(key)
            tg.start_soon(self._ask_one, found[0].task_id, key, request)

    async def _ask_one(self, task_id: str, key: str, request: Mapping[str, Any]) -> None:
        kind, result_type = self.kind_of(request)
        metadata = ServerMessageMetadata(related_request_id=self.ctx.request_id)
        try:
            sent = kind.model_validate(dict(request))
            reply = await self.ctx.session.send_request(sent, result_type, metadata=metadata)  # type: ignore[arg-type]
        except (MCPError, pydantic.ValidationError, RuntimeError) as exc:
            # The question stays open: the model sees it in the handle and answers with task_respond.
            logger.info("task %s: the client did not answer %r on its session: %s", task_id, key, exc)
            return
        answer = reply.model_dump(by_alias=True, exclude_none=True, mode="json")
        found = await self.service.find(envelope.principal(self.ctx), task_id)
        if found is not None:
            await self.service.answer(found, {key: answer})


class _Progress:
    """`notifications/progress` for the request's token: each new statusMessage, at most 4 a second."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.wanted = envelope.progress_token(ctx) is not None
        self.value = 0.0
        self.sent_message: str | None = None
        self.sent_at = -math.inf
        self.pending: tuple[str, float | None, float | None] | None = None

    async def saw(self, found: Found) -> None:
        if not self.wanted:
            return
        record, view = found
        message = view.status_message or view.status
        if message != self.sent_message:
            current, total = _numbers(record.progress)
            self.pending = (message, current, total)
            await self.tick()

    def due_in(self) -> float:
        """Seconds until a held-back message may go, or the next keepalive (inf: nothing to send)."""
        if not self.wanted:
            return math.inf
        gap = PROGRESS_GAP_S if self.pending is not None else PROGRESS_KEEPALIVE_S
        return max(self.sent_at + gap - anyio.current_time(), 0.0)

    async def tick(self) -> None:
        """Send the held-back message once the gap has passed, or a keepalive when the job is silent."""
        if not self.wanted or self.due_in() > 0:
            return
        if self.pending is None:
            if self.sent_message is None:
                return  # nothing said yet: no keepalive either
            self.pending = (self.sent_message, None, None)
        message, current, total = self.pending
        # Strictly increasing, as the spec requires: the job's own count when it grows, else a step.
        self.value = current if current is not None and current > self.value else self.value + 1
        self.pending = None
        self.sent_message = message
        self.sent_at = anyio.current_time()
        await self.ctx.session.report_progress(self.value, total, message)


def _numbers(progress: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """`current` and `total` from PROGRESS meta (`update_state(meta={"current": 3, "total": 10})`)."""
    info = (progress or {}).get("result")
    if not isinstance(info, Mapping):
        return None, None
    current, total = info.get("current"), info.get("total")
    if not isinstance(current, int | float) or isinstance(current, bool):
        return None, None
    return float(current), float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None


async def _call_sync(
    service: TaskService, spec: ToolSpec, task_id: str, watcher: Watcher, *, read_first: bool = False
) -> Any:
    """Wait for the queued job's result; cancel it after sync_timeout_s (no task to hand back)."""
    timeout_s = service.settings.sync_timeout_s
    deadline = anyio.current_time() + timeout_s
    view = None
    done = False
    try:
        # A task just created is as written until its job reports, and every report since the watch
        # began wakes `changed` (so the first wait loses nothing); a repeated call's is read first.
        while not done and anyio.current_time() < deadline:
            if not read_first:
                await watcher.changed(deadline - anyio.current_time())
            read_first = False
            found = await service.read_view(task_id)
            view = None if found is None else found[1]
            done = view is None or view.terminal
    finally:
        if not done:  # timed out, or the caller went away: the job must not run on unseen
            with anyio.CancelScope(shield=True):
                await service.cancel(task_id, spec)
    if not done:
        return _tool_error(
            spec.name,
            f"no result within {timeout_s:g} s, so the job was cancelled; clients that declare the tasks "
            "extension can run it as a task",
        )
    if view is None:
        return _tool_error(spec.name, "the job was cancelled")
    return _final(spec, view)


def _tool_error(tool: str, reason: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate(tool_error_result(tool, reason))
