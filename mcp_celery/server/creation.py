"""`tools/call`: arguments, the task mode, `ask_first` questions, then a task or a synchronous run.

Server tier. The server alone decides: a request that declares the tasks extension gets a
`CreateTaskResult` for a tool that may run as a task; any other request gets the result
itself (or -32021 when the tool must run as a task). The record is written before the job is
queued, so `tasks/get` succeeds the moment the handle is returned.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import anyio
import pydantic
from mcp import types
from mcp.shared.exceptions import MCPError

from mcp_celery.inputs import invalid_answer_reason, missing_capability
from mcp_celery.protocol import INTERNAL_ERROR, INVALID_PARAMS, create_task_result, now_ms, tool_error_result
from mcp_celery.server import envelope, limits
from mcp_celery.server.envelope import RequestContext
from mcp_celery.server.service import TaskService
from mcp_celery.store.schema import TaskRecord
from mcp_celery.tools import ToolSpec

__all__ = ["call_tool", "new_task_id"]

logger = logging.getLogger(__name__)


def new_task_id() -> str:
    """192 random bits, URL-safe (the spec asks for at least 122): a task id can be neither guessed nor enumerated.

    Never starting with '-': `mcp-celery tasks wait -abc...` would read the id as an option.
    """
    while True:
        task_id = secrets.token_urlsafe(24)
        if not task_id.startswith("-"):
            return task_id


async def call_tool(service: TaskService, ctx: RequestContext, params: types.CallToolRequestParams) -> Any:
    """The `tools/call` handler."""
    limits.check_arguments(service.settings, params.arguments)
    if params.input_responses:
        limits.check_input_responses(service.settings, _dump_responses(params.input_responses))
    spec = service.tools.get(params.name)
    if spec is None:
        raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
    try:
        arguments = spec.validate_arguments(params.arguments)
    except pydantic.ValidationError as exc:
        # The same answer the SDK's MCPServer gives for invalid tool input.
        return _tool_error(spec.name, str(exc))
    declared = envelope.tasks_declared(ctx)
    if spec.task_mode == "required" and not declared:
        raise envelope.missing_capability()
    first_answers: dict[str, Any] = {}
    questions = _questions(spec, arguments)
    if questions:
        outcome = _settle_first(ctx, params, questions)
        if isinstance(outcome, types.InputRequiredResult):
            return outcome
        first_answers = outcome
    # Checked before any record exists: over the quota, nothing is written or queued.
    await limits.enforce_quota(service.store, envelope.principal(ctx), service.settings.max_live_tasks_per_principal)
    record = _new_record(service, ctx, spec, first_answers, sync=not declared or spec.task_mode == "forbidden")
    if record.sync:
        return await _run_sync(service, spec, record, arguments)
    await _enqueue(service, spec, record, arguments)
    return create_task_result(
        task_id=record.task_id, created_ms=record.created_ms, ttl_ms=record.ttl_ms, poll_ms=record.poll_ms
    )


def _questions(spec: ToolSpec, arguments: dict[str, Any]) -> Mapping[str, Mapping[str, Any]] | None:
    ask = spec.ask_first
    if ask is None:
        return None
    return ask(arguments) if callable(ask) else ask


def _settle_first(
    ctx: RequestContext, params: types.CallToolRequestParams, questions: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | types.InputRequiredResult:
    """The answers to a tool's ask_first questions, or the MRTR round that asks for the missing ones."""
    capabilities = envelope.client_capabilities(ctx)
    for key, request in questions.items():
        reason = missing_capability(request, capabilities)
        if reason:
            raise envelope.missing_capability(request, f"cannot ask {key!r}: {reason}")
    responses = _dump_responses(params.input_responses)
    answers: dict[str, Any] = {}
    for key, request in questions.items():
        answer = responses.get(key)
        reason = None if answer is None else invalid_answer_reason(request, answer)
        if answer is not None and reason is None:
            answers[key] = answer
        elif reason:
            logger.info("tool %r: answer to %r rejected: %s", params.name, key, reason)
    missing = {k: dict(v) for k, v in questions.items() if k not in answers}
    if missing:
        return types.InputRequiredResult.model_validate({"inputRequests": missing})
    return answers


def _dump_responses(responses: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        key: value.model_dump(by_alias=True, exclude_none=True, mode="json")
        if isinstance(value, pydantic.BaseModel)
        else value
        for key, value in (responses or {}).items()
    }


def _new_record(
    service: TaskService, ctx: RequestContext, spec: ToolSpec, first_answers: dict[str, Any], *, sync: bool
) -> TaskRecord:
    return TaskRecord(
        task_id=new_task_id(),
        tool=spec.name,
        created_ms=now_ms(),
        ttl_ms=service.binding.lifetimes.ttl_ms,
        poll_ms=service.settings.poll_interval_ms,
        capabilities=envelope.client_capabilities(ctx),
        owner=envelope.principal(ctx),
        sync=sync,
        first_answers=first_answers,
    )


async def _enqueue(service: TaskService, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any]) -> None:
    """Record first, then queue: a `tasks/get` right after the handle is returned must succeed.

    Both are done before this returns, so the task is durable before its id is handed out.
    """
    task_id = record.task_id
    indexed = service.settings.max_live_tasks_per_principal is not None
    check_at_ms = service.first_check_ms(record.created_ms)
    publisher = service.publisher

    # argsrepr names the tool in Flower (ToolSpec.argsrepr).
    options = {"kwargs": arguments, "task_id": task_id, "argsrepr": spec.argsrepr}
    try:
        if not await publisher.native():
            await service.store.create(record, index=indexed, check_at_ms=check_at_ms)
            await publisher.publish_on_thread(spec.celery_task, **options)
            return
        # Built before anything is written: a message that cannot be built leaves nothing behind.
        commands = publisher.build(spec.celery_task, **options)
        # One round trip when the broker is the records' Redis database: record first, then message.
        then = commands if publisher.shares_store else ()
        await service.store.create(record, index=indexed, check_at_ms=check_at_ms, then=then)
        if not publisher.shares_store:
            await publisher.send(commands)
    except Exception as exc:
        logger.exception("could not queue job for tool %r", spec.name)
        with contextlib.suppress(Exception):  # the record may not exist, or Redis may be what failed
            await service.store.delete(task_id)
        # The broker's error can name its URL, password included: only debug mode shows it, redacted.
        raise MCPError(INTERNAL_ERROR, f"could not queue the job: {limits.describe(exc, service.settings)}") from exc


async def _run_sync(
    service: TaskService, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any]
) -> types.CallToolResult:
    """Run the job and wait for its result (the request did not declare the tasks extension)."""
    timeout_s = service.settings.sync_timeout_s
    deadline = anyio.current_time() + timeout_s
    view = None
    queued = done = False
    # Watch before queueing: every state the job stores is published on the task's event channel.
    async with service.events.watch([record.task_id]) as watcher:
        try:
            await _enqueue(service, spec, record, arguments)
            queued = True
            # Nothing to read yet: the task is as just written until its job reports, and every
            # report since the watch began wakes `changed` (so the first wait loses nothing).
            while not done and anyio.current_time() < deadline:
                await watcher.changed(deadline - anyio.current_time())
                found = await service.read_view(record.task_id)
                view = None if found is None else found[1]
                done = view is None or view.terminal
        finally:
            if queued and not done:  # timed out, or the caller went away: the job must not run on unseen
                with anyio.CancelScope(shield=True):
                    await service.cancel(record.task_id, spec)
    if not done:
        return _tool_error(
            spec.name,
            f"no result within {timeout_s:g} s, so the job was cancelled; clients that declare the tasks "
            "extension can run it as a task",
        )
    if view is None or view.status == "cancelled":
        return _tool_error(spec.name, "the job was cancelled")
    if view.status == "failed":
        error = view.error or {}
        raise MCPError(int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "")), error.get("data"))
    return types.CallToolResult.model_validate(view.result)


def _tool_error(tool: str, reason: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate(tool_error_result(tool, reason))
