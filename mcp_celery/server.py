"""The MCP side: a lowlevel mcp `Server` that serves Celery-backed tools as SEP-2663 tasks.

Server tier. Every handler reads and writes Redis only; nothing about a task lives in
this process's memory, so any number of replicas can serve the same tasks and a
restart loses nothing. The one in-process thing is a timer per cancel that, after the
grace period, terminates a job that opted in (the read path reports the task cancelled
on its own, timer or not).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pydantic
import redis.asyncio as aioredis
from anyio.abc import TaskGroup
from celery import Celery
from celery import _state as celery_state
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery import limits
from mcp_celery._version import __version__
from mcp_celery.auth import request_principal
from mcp_celery.inputs import invalid_answer_reason, missing_capability
from mcp_celery.mapping import TaskView, expired, task_view
from mcp_celery.protocol import (
    CLIENT_CAPABILITIES_META,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    TASKS_EXTENSION,
    iso_ms,
    missing_capability_data,
)
from mcp_celery.record import TaskRecord
from mcp_celery.runtime import Runtime, now_ms, runtime
from mcp_celery.settings import Settings
from mcp_celery.store import AsyncStore
from mcp_celery.tools import ToolSpec, registry
from mcp_celery.waiter import READY_STATES, ResultWaiter

__all__ = ["TaskIdParams", "TaskServer", "UpdateTaskParams", "create_server"]

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    # Values stay untyped: answers under keys that are not outstanding are ignored,
    # whatever they hold, so they must not fail validation here.
    model_config = pydantic.ConfigDict(extra="allow")
    input_responses: dict[str, Any]


def create_server(app: Celery, settings: Settings | None = None, *, name: str | None = None) -> Server[Any]:
    """An MCP server for every tool registered on `app` (build it after importing the job module)."""
    return TaskServer(app, settings, name=name).server


class TaskServer:
    def __init__(self, app: Celery, settings: Settings | None = None, *, name: str | None = None) -> None:
        # This process never waits on a Celery result with AsyncResult.get(). Telling Celery so
        # stops its Redis backend from SUBSCRIBE-ing to every task the server queues (and never
        # unsubscribing until the result arrives): two commands and a growing channel set per task.
        celery_state._set_task_join_will_block(True)  # type: ignore[attr-defined]
        self.app = app
        self.rt: Runtime = runtime(app, settings)
        self.settings = self.rt.settings
        self._store: AsyncStore | None = None
        self._waiter: ResultWaiter | None = None
        self._tg: TaskGroup | None = None
        server: Server[Any] = Server(
            name or f"mcp-celery ({app.main})",
            version=__version__,
            lifespan=self._lifespan,
            on_list_tools=self.list_tools,
            # Without this the SDK runs the whole tools/list handler on every tools/call that has
            # arguments, to find the schema it checks Mcp-Param headers against.
            get_tool_input_schema=self._input_schema,
        )
        # safe_errors: an unexpected exception reaches the client as a bare -32603, never its text.
        guard = functools.partial(limits.safe_errors, self.settings)
        server.add_request_handler("tools/call", types.CallToolRequestParams, guard(self.call_tool))
        server.add_request_handler("tasks/get", TaskIdParams, guard(self.tasks_get))
        server.add_request_handler("tasks/update", UpdateTaskParams, guard(self.tasks_update))
        server.add_request_handler("tasks/cancel", TaskIdParams, guard(self.tasks_cancel))
        server.extensions[TASKS_EXTENSION] = {}
        self.server = server

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return registry(self.app)

    @property
    def store(self) -> AsyncStore:
        if self._store is None:
            client = aioredis.Redis.from_url(self.rt.redis_url)
            self._store = AsyncStore(client, self.rt.keys, self.rt.meta_key)
        return self._store

    @asynccontextmanager
    async def _lifespan(self, _: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        waiter = self._waiter = ResultWaiter(self.store.redis, self.rt.decode_meta)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(waiter.run)
            try:
                yield {}
            finally:
                tg.cancel_scope.cancel()
                self._tg = self._waiter = None
        await waiter.aclose()
        if self._store is not None:
            await self._store.redis.aclose()
            self._store = None

    # ---------------------------------------------------------------- tools

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        spec = self.tools.get(name)
        return None if spec is None else spec.input_schema

    async def list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(spec.to_wire()) for spec in self.tools.values()])

    async def call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        limits.check_arguments(self.settings, params.arguments)
        if params.input_responses:
            limits.check_input_responses(self.settings, _dump_responses(params.input_responses))
        spec = self.tools.get(params.name)
        if spec is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            arguments = spec.validate_arguments(params.arguments)
        except pydantic.ValidationError as exc:
            # The same answer the SDK's MCPServer gives for invalid tool input.
            return _tool_error(f"Error executing tool {spec.name}: {exc}")
        declared = tasks_declared(ctx)
        if spec.mode == "required" and not declared:
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability", missing_capability_data()
            )
        first_answers: dict[str, Any] = {}
        if spec.ask_first is not None:
            questions = _questions(spec, arguments)
            if questions:
                outcome = self._settle_first(ctx, params, questions)
                if isinstance(outcome, types.InputRequiredResult):
                    return outcome
                first_answers = outcome
        # Checked before any record exists: over the quota, nothing is written or queued.
        await limits.enforce_quota(
            self.store, principal(ctx), self.settings.max_live_tasks_per_principal, self.rt.decode_meta
        )
        if declared and spec.mode != "forbidden":
            return await self._create_task(ctx, spec, arguments, first_answers)
        return await self._run_sync(ctx, spec, arguments, first_answers)

    def _settle_first(
        self, ctx: Ctx, params: types.CallToolRequestParams, questions: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any] | types.InputRequiredResult:
        """The answers to a tool's ask_first questions, or the MRTR round that asks for the missing ones."""
        capabilities = client_capabilities(ctx)
        for key, request in questions.items():
            reason = missing_capability(request, capabilities)
            if reason:
                raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, f"cannot ask {key!r}: {reason}", _needed(request))
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

    async def _create_task(
        self, ctx: Ctx, spec: ToolSpec, arguments: dict[str, Any], first_answers: dict[str, Any]
    ) -> dict[str, Any]:
        record = self._new_record(ctx, spec, first_answers, sync=False)
        await self._enqueue(spec, record, arguments)
        return {
            "resultType": "task",
            "taskId": record.task_id,
            "status": "working",
            "statusMessage": "queued",
            "createdAt": iso_ms(record.created_ms),
            "lastUpdatedAt": iso_ms(record.created_ms),
            "ttlMs": record.ttl_ms,
            "pollIntervalMs": record.poll_ms,
        }

    def _new_record(self, ctx: Ctx, spec: ToolSpec, first_answers: dict[str, Any], *, sync: bool) -> TaskRecord:
        return TaskRecord(
            task_id=secrets.token_urlsafe(24),  # 192 random bits (the spec asks for at least 122)
            tool=spec.name,
            created_ms=now_ms(),
            ttl_ms=self.rt.ttl_ms,
            poll_ms=self.settings.poll_interval_ms,
            capabilities=client_capabilities(ctx),
            owner=principal(ctx),
            sync=sync,
            first_answers=first_answers,
        )

    async def _enqueue(self, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any]) -> None:
        """Record first, then queue: a `tasks/get` right after the handle is returned must succeed."""
        task_id = record.task_id
        indexed = self.settings.max_live_tasks_per_principal is not None
        await self.store.create(record, self.rt.pending_meta(task_id), self.rt.ttl_s, self.rt.keep_s, index=indexed)
        try:
            await anyio.to_thread.run_sync(lambda: spec.celery_task.apply_async(kwargs=arguments, task_id=task_id))
        except Exception as exc:
            logger.exception("could not queue job for tool %r", spec.name)
            await self.store.delete(task_id)
            # The broker's error can name its URL, password included: only debug mode shows it, redacted.
            raise MCPError(INTERNAL_ERROR, f"could not queue the job: {limits.describe(exc, self.settings)}") from exc

    async def _run_sync(
        self, ctx: Ctx, spec: ToolSpec, arguments: dict[str, Any], first_answers: dict[str, Any]
    ) -> types.CallToolResult:
        record = self._new_record(ctx, spec, first_answers, sync=True)
        waiter = self._waiter
        if waiter is None:
            raise MCPError(INTERNAL_ERROR, "the server is not running (no lifespan)")
        channel = bytes(self.rt.meta_key(record.task_id))
        # Subscribe before queueing: Celery publishes every state it stores on the meta key.
        ready = await waiter.subscribe(channel)
        finished = False
        try:
            await self._enqueue(spec, record, arguments)
            with anyio.move_on_after(self.settings.sync_timeout_s):
                if not await waiter.ready_now(channel):
                    await ready.wait()
                finished = True
        finally:
            with anyio.CancelScope(shield=True):
                await waiter.unsubscribe(channel)
                if not finished:
                    await self._cancel(record.task_id, spec)
        if not finished:
            return _tool_error(
                f"Error executing tool {spec.name}: no result within {self.settings.sync_timeout_s:g} s, so the job "
                "was cancelled; clients that declare the tasks extension can run it as a task"
            )
        view = await self._view(record.task_id)
        if view is None or view.status == "cancelled":
            return _tool_error(f"Error executing tool {spec.name}: the job was cancelled")
        if view.status == "failed":
            error = view.error or {}
            raise MCPError(int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "")), error.get("data"))
        return types.CallToolResult.model_validate(view.result)

    # ---------------------------------------------------------------- tasks/*

    async def tasks_get(self, ctx: Ctx, params: TaskIdParams) -> dict[str, Any]:
        record, view = await self._lookup(ctx, params.task_id)
        return {"resultType": "complete", **view.detailed_task(record, now_ms())}

    async def tasks_update(self, ctx: Ctx, params: UpdateTaskParams) -> dict[str, Any]:
        limits.check_input_responses(self.settings, params.input_responses)
        record, view = await self._lookup(ctx, params.task_id)
        if view.status != "input_required":
            return {}
        answers: dict[str, str] = {}
        for key, answer in params.input_responses.items():
            request = record.inputs.get(key)
            if request is None:
                continue  # never issued, already answered or withdrawn: ignored (spec SHOULD)
            reason = invalid_answer_reason(request, answer)
            if reason:
                logger.info(
                    "task %s: answer to %r rejected, request stays outstanding: %s", record.task_id, key, reason
                )
                continue
            answers[key] = json.dumps(answer)
        if answers:
            await self.store.answer(record.task_id, answers, now_ms(), self.rt.keep_s)
        return {}

    async def tasks_cancel(self, ctx: Ctx, params: TaskIdParams) -> dict[str, Any]:
        record, view = await self._lookup(ctx, params.task_id)
        if not view.terminal and record.cancel_ms is None:
            await self._cancel(record.task_id, self.tools.get(record.tool))
        return {}

    async def _cancel(self, task_id: str, spec: ToolSpec | None) -> None:
        await self.store.request_cancel(task_id, now_ms(), self.rt.keep_s)
        # Drops a queued copy; a running job learns of the cancel from the flag in Redis.
        await anyio.to_thread.run_sync(lambda: self.app.control.revoke(task_id))
        if self._tg is not None and spec is not None and spec.terminate_on_cancel:
            self._tg.start_soon(self._terminate_after_grace, task_id)

    async def _terminate_after_grace(self, task_id: str) -> None:
        await anyio.sleep(self.settings.cancel_grace_s)
        record, meta = await self.store.read(task_id)
        decoded = self.rt.decode_meta(meta)
        if record is not None and (decoded or {}).get("status") not in READY_STATES:
            logger.warning("task %s did not stop within the grace period; terminating its worker process", task_id)
            await anyio.to_thread.run_sync(lambda: self.app.control.revoke(task_id, terminate=True))

    async def _lookup(self, ctx: Ctx, task_id: str) -> tuple[TaskRecord, TaskView]:
        """Gate, header check and read shared by tasks/get, tasks/update and tasks/cancel."""
        if not tasks_declared(ctx):
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability", missing_capability_data()
            )
        headers = getattr(ctx.request, "headers", None)
        if headers is not None and headers.get("mcp-name") is not None:
            if decode_header_value(headers.get("mcp-name")) != task_id:
                raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match params.taskId")
        # An id longer than any we issue is not looked up: it gets the unknown-task answer.
        found = await self._read_view(task_id) if limits.task_id_acceptable(self.settings, task_id) else None
        if found is None or found[0].owner != principal(ctx):
            # Unknown, expired and foreign tasks get the same answer: existence does not leak.
            raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return found

    async def _view(self, task_id: str) -> TaskView | None:
        found = await self._read_view(task_id)
        return None if found is None else found[1]

    async def _read_view(self, task_id: str) -> tuple[TaskRecord, TaskView] | None:
        record, raw_meta = await self.store.read(task_id)
        if record is None:
            return None
        meta = self.rt.decode_meta(raw_meta)
        now = now_ms()
        view = task_view(
            record,
            meta,
            now,
            self.tools.get(record.tool),
            grace_ms=int(self.settings.cancel_grace_s * 1000),
            debug=self.settings.debug,
        )
        if view.terminal and record.final is None and (meta or {}).get("status") != "SUCCESS":
            # Celery itself never overwrites SUCCESS; every other terminal state is frozen
            # here so that a late result, a redelivery or a retry cannot change it.
            frozen = await self.store.freeze(task_id, view.to_json())
            if frozen is None:
                return None
            view = TaskView.from_frozen(frozen)
        if expired(record, view, now):
            return None
        return record, view


# -------------------------------------------------------------------- helpers


def tasks_declared(ctx: Ctx) -> bool:
    """Whether *this* request declares the tasks extension (never inferred from earlier ones)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False  # clients of the initialize era get the synchronous behaviour
    extensions = client_capabilities(ctx).get("extensions")
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def client_capabilities(ctx: Ctx) -> dict[str, Any]:
    meta = ctx.meta or {}
    raw = meta.get(CLIENT_CAPABILITIES_META)  # type: ignore[misc]
    if isinstance(raw, dict):
        return raw
    caps = ctx.session.client_capabilities
    return {} if caps is None else caps.model_dump(by_alias=True, exclude_none=True, mode="json")


def principal(ctx: Ctx) -> str:
    """Who owns tasks created by this request: the verified token's principal over HTTP ("" with no
    authentication configured), the local user over stdio (which has no HTTP request)."""
    return request_principal(over_http=ctx.request is not None)


def _questions(spec: ToolSpec, arguments: dict[str, Any]) -> Mapping[str, Mapping[str, Any]] | None:
    ask = spec.ask_first
    return ask(arguments) if callable(ask) else ask


def _dump_responses(responses: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (responses or {}).items():
        out[key] = (
            value.model_dump(by_alias=True, exclude_none=True, mode="json")
            if isinstance(value, pydantic.BaseModel)
            else value
        )
    return out


def _needed(request: Mapping[str, Any]) -> dict[str, Any]:
    capability = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling"}.get(
        str(request.get("method")), "roots"
    )
    return {"requiredCapabilities": {capability: {}}}


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
