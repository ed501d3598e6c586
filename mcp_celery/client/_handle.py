"""The explicit task handle: start a tool as a task, then `status()`, `wait()`, `result()`, `cancel()`.

Waiting polls `tasks/get` at the server's `pollIntervalMs`. When the server serves `subscriptions/listen`
with `taskIds`, a listen stream runs alongside and each `notifications/tasks` wakes the waiter at once;
once the server acknowledged the task id, polling slows to a safety net. A server without it (a -32601
or any error on listen) is remembered per session and simply polled.

Input requests are answered once per key: the server re-sends every outstanding key on each poll until
the answer lands, so a key is claimed before its callback runs and is never answered twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
from mcp import Client
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ErrorData, InputRequest, InputRequiredResult, InputResponse
from pydantic import TypeAdapter, ValidationError

from mcp_celery import idempotency
from mcp_celery.client._errors import NotATaskError, TaskCancelledError, TaskFailedError, TaskInputError
from mcp_celery.client._state import TaskState
from mcp_celery.protocol import (
    Ack,
    CancelTaskRequest,
    CreateTaskResult,
    DetailedTask,
    GetTaskRequest,
    TaskIdParams,
    UpdateTaskParams,
    UpdateTaskRequest,
    listen_request,
)

__all__ = ["TaskHandle", "start_task"]

logger = logging.getLogger(__name__)

_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)
_DEFAULT_POLL_S = 1.0
_MIN_POLL_S = 0.05
#: With pushes acknowledged, polls only guard against a lost notification.
_SAFETY_POLL_S = 10.0
_MAX_INPUT_ROUNDS = 10

OnUpdate = Callable[[DetailedTask], None]


class TaskHandle:
    """A task on a connected session. Build it with `start_task`, or `TasksExtension.attach` to resume one."""

    def __init__(self, session: ClientSession, state: TaskState, task_id: str, tool: str | None = None) -> None:
        self.session = session
        self.task_id = task_id
        self.tool = tool
        self.last: DetailedTask | None = None
        self._state = state
        self._watch = state.watch(task_id)

    async def status(self) -> DetailedTask:
        """`tasks/get` once; records the status in the journal."""
        task = await self.session.send_request(GetTaskRequest(params=TaskIdParams(task_id=self.task_id)), DetailedTask)
        self._seen(task)
        return task

    async def cancel(self) -> None:
        """`tasks/cancel`. Cooperative: the task may still end `completed` or `failed`; `wait()` tells."""
        await self.session.send_request(CancelTaskRequest(params=TaskIdParams(task_id=self.task_id)), Ack)

    async def answer(self, responses: dict[str, Any]) -> None:
        """`tasks/update` with `responses` (key → InputResponse as JSON), for callers answering by hand."""
        request = UpdateTaskRequest(params=UpdateTaskParams(task_id=self.task_id, input_responses=responses))
        await self.session.send_request(request, Ack)

    async def wait(
        self, *, timeout: float | None = None, answer_inputs: bool = True, on_update: OnUpdate | None = None
    ) -> DetailedTask:
        """Wait until the task is terminal and return its final DetailedTask.

        Args:
            timeout: seconds before `TimeoutError`; None waits as long as it takes.
            answer_inputs: answer `inputRequests` through the input handler (else just wait them out).
            on_update: called with every state seen (polled or pushed), e.g. for a progress line.
        """
        final: DetailedTask | None = None
        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tasks:
                if self._state.may_listen(self.session):
                    tasks.start_soon(self._listen)
                try:
                    final = await self._drive(answer_inputs, on_update)
                finally:
                    tasks.cancel_scope.cancel()
        assert final is not None  # _drive returns or raises
        return final

    async def result(self, *, timeout: float | None = None) -> CallToolResult:
        """Wait (unless the task is already known to be terminal), then the tool's result (`isError` ones too).

        Raises:
            TaskFailedError: the task ended `failed` (its JSON-RPC error).
            TaskCancelledError: the task ended `cancelled`.
        """
        known = self.last
        return final_result(known if known is not None and known.terminal else await self.wait(timeout=timeout))

    async def _drive(self, answer_inputs: bool, on_update: OnUpdate | None) -> DetailedTask:
        task = await self.status()
        while True:
            if on_update is not None:
                on_update(task)
            if task.terminal:
                return task
            if task.status == "input_required" and answer_inputs and await self._answer(task):
                task = await self.status()
                continue
            pushed = await self._watch.next_push(self._poll_delay(task))
            if pushed is not None:
                self._seen(pushed)
            task = pushed or await self.status()

    def _poll_delay(self, task: DetailedTask) -> float:
        interval = task.poll_interval_ms / 1000 if task.poll_interval_ms else _DEFAULT_POLL_S
        interval = max(interval, _MIN_POLL_S)
        return max(interval, _SAFETY_POLL_S) if self._watch.pushed else interval

    def _seen(self, task: DetailedTask) -> None:
        previous, self.last = self.last, task
        if previous is None or (previous.status, previous.status_message) != (task.status, task.status_message):
            self._state.journal_status(task)

    async def _answer(self, task: DetailedTask) -> bool:
        """Answer the keys nobody claimed yet; True when a `tasks/update` went out."""
        pending = {k: v for k, v in (task.input_requests or {}).items() if k not in self._watch.claimed_keys}
        if not pending:
            return False
        self._watch.claimed_keys.update(pending)
        try:
            responses = {key: await self._answer_one(task, key, raw) for key, raw in pending.items()}
            await self.answer(responses)
        except BaseException:
            self._watch.claimed_keys.difference_update(pending)  # not delivered: may be answered again
            raise
        return True

    async def _answer_one(self, task: DetailedTask, key: str, raw: Any) -> dict[str, Any]:
        try:
            request = _INPUT_REQUEST.validate_python(raw)
        except ValidationError as exc:
            raise TaskInputError(f"input request {key!r} has a shape this client cannot read: {exc}", task) from exc
        answer = await dispatch_input(self.session, self._state, key, request)
        if isinstance(answer, ErrorData):
            raise TaskInputError(f"cannot answer {request.method} {key!r}: {answer.message}", task)
        return answer.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _listen(self) -> None:
        try:
            await self.session.send_request(listen_request([self.task_id]), Ack)
        except MCPError as exc:
            logger.debug("subscriptions/listen refused (%s); polling tasks/get instead", exc.error.message)
            self._state.listen_refused(self.session)
        finally:
            self._watch.pushed = False  # the stream is over: back to the server's poll interval


async def dispatch_input(
    session: ClientSession, state: TaskState, key: str, request: InputRequest
) -> InputResponse | ErrorData:
    """Answer one input request through the configured handler, else the SDK client's callbacks."""
    ctx = ClientRequestContext(session=session, request_id=key, meta=request.params.meta if request.params else None)
    if state.input_handler is not None:
        return await state.input_handler(ctx, request)
    return await session.dispatch_input_request(ctx, request)


def final_result(task: DetailedTask) -> CallToolResult:
    if task.status == "failed":
        raise TaskFailedError(task)
    if task.status == "cancelled":
        raise TaskCancelledError(f"task {task.task_id} was cancelled", task)
    result = task.call_tool_result()
    if result is None:
        raise TaskFailedError(task)  # a completed task without a result breaks the spec: report it as failed
    return result


async def start_task(
    client: Client, state: TaskState, tool: str, arguments: dict[str, Any] | None = None
) -> TaskHandle:
    """Call `tool` and return the handle of the task the server started, journaled before it is returned.

    Input requests of an MRTR round before the task exists (`InputRequiredResult`) are answered first.
    Every round carries the call's one fresh idempotency key (`_meta`), journaled with the task: over HTTP a
    round whose reply is lost is sent again with it (`mcp_celery.client._retries`), and the job runs once.

    Raises:
        NotATaskError: the server answered inline; the result is on the error.
    """
    session = client.session
    call_key = idempotency.new_key()  # one for every round of this call (the answers' keys are others)
    meta: Any = {idempotency.META: call_key}
    raw = await session.call_tool(tool, arguments, meta=meta, allow_input_required=True, allow_claimed=True)
    for _ in range(_MAX_INPUT_ROUNDS):
        if not isinstance(raw, InputRequiredResult):
            break
        answers = {}
        for key, request in (raw.input_requests or {}).items():
            answer = await dispatch_input(session, state, key, request)
            if isinstance(answer, ErrorData):
                raise TaskInputError(f"cannot answer {request.method} {key!r}: {answer.message}")
            answers[key] = answer
        raw = await session.call_tool(
            tool, arguments, input_responses=answers, request_state=raw.request_state, meta=meta,
            allow_input_required=True, allow_claimed=True,
        )  # fmt: skip
    if isinstance(raw, CallToolResult):
        raise NotATaskError(raw)
    if not isinstance(raw, CreateTaskResult):
        raise TaskInputError(f"{tool}: no task after {_MAX_INPUT_ROUNDS} input rounds")
    if state.journal is not None and state.target is not None:
        state.journal.record(raw.task_id, state.target, tool, arguments, raw.status, idempotency_key=call_key)
    handle = TaskHandle(session, state, raw.task_id, tool)
    handle.last = DetailedTask.model_validate(raw.model_dump(by_alias=True, exclude={"result_type"}))
    return handle
