"""`tools/call`: arguments, the task mode and `ask_first` questions, then the surface that serves it.

Server tier. The server alone decides: a request that declares the tasks extension gets a
`CreateTaskResult` for a tool that may run as a task, its record written before the job is queued,
so `tasks/get` succeeds the moment the handle is returned. Any other request is a plain call
(`plain`): the tool's own result when the job ends within the inline window, else a task handle
that the lifecycle tools (`lifecycle`) follow; a tool that must run as a task gets -32021 instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pydantic
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery.core.tools import ToolSpec
from mcp_celery.inputs import invalid_answer_reason, missing_capability
from mcp_celery.protocol import INVALID_PARAMS, create_task_result, tool_error_result
from mcp_celery.server.edge import limits
from mcp_celery.server.engine.service import TaskService
from mcp_celery.server.plain import call as plain
from mcp_celery.server.plain import lifecycle
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext

__all__ = ["call_tool"]

logger = logging.getLogger(__name__)


async def call_tool(service: TaskService, ctx: RequestContext, params: types.CallToolRequestParams) -> Any:
    """The `tools/call` handler."""
    limits.check_arguments(service.settings, params.arguments)
    if params.input_responses:
        limits.check_input_responses(service.settings, envelope.input_responses(params))
    if service.settings.tool_fallback and params.name in lifecycle.NAMES:
        return await lifecycle.call(service, ctx, params)
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
    if params.request_state is not None and service.settings.tool_fallback and spec.task_mode == "optional":
        return await plain.resume_call(service, ctx, spec, params)  # the retry of a plain call's MRTR round
    first_answers: dict[str, Any] = {}
    questions = _questions(spec, arguments)
    if questions:
        outcome = _settle_first(ctx, params, questions)
        if isinstance(outcome, types.InputRequiredResult):
            return outcome
        first_answers = outcome
    if not declared or spec.task_mode == "forbidden":
        return await plain.call(service, ctx, spec, arguments, first_answers)
    record = service.new_record(
        spec,
        owner=envelope.principal(ctx),
        capabilities=envelope.client_capabilities(ctx),
        first_answers=first_answers,
    )
    key = envelope.idempotency_key(ctx, service.settings.max_idempotency_key_length)
    earlier = await service.create_unless_repeated(spec, record, arguments, key)
    task = record if earlier is None else earlier[0]  # a repeated call gets the first one's CreateTaskResult
    return create_task_result(
        task_id=task.task_id, created_ms=task.created_ms, ttl_ms=task.ttl_ms, poll_ms=task.poll_ms
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
        if reason is None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            reason = "an MRTR round (resultType input_required) needs protocol revision 2026-07-28"
        if reason:
            raise envelope.missing_capability(request, f"cannot ask {key!r}: {reason}")
    responses = envelope.input_responses(params)
    answers: dict[str, Any] = {}
    for key, request in questions.items():
        answer = responses.get(key)
        reason = None if answer is None else invalid_answer_reason(request, answer)
        if answer is not None and reason is None:
            answers[key] = answer
        elif reason:  # not logged: the reason can quote the answer
            logger.info("tool %r: answer to %r rejected", params.name, key)
    missing = {k: dict(v) for k, v in questions.items() if k not in answers}
    if missing:
        return types.InputRequiredResult.model_validate({"inputRequests": missing})
    return answers


def _tool_error(tool: str, reason: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate(tool_error_result(tool, reason))
