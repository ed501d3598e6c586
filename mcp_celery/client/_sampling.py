"""Answering `sampling/createMessage` with a program: the request as JSON on its stdin, the result on its stdout.

Every sampler of this package is an SDK `sampling_callback` that supports tool use: pass it as
`sampling_callback=` with `sampling_capabilities=SAMPLING_WITH_TOOLS`. When it cannot produce a
completion (the program fails, the model's server is down, the user declines at the terminal),
it answers with `mcp_celery.inputs.declined_sampling` instead of an error: a task's input request
has no error answer, and a job left without one would wait until its input timeout. Jobs tell
such an answer by its `stopReason` (`mcp_celery.inputs.SAMPLING_DECLINED`).
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Sequence
from typing import Any

import anyio
import pydantic
from mcp.client import ClientRequestContext
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    SamplingCapability,
    SamplingToolsCapability,
)

from mcp_celery.inputs import declined_sampling, sampling_answer_model

__all__ = ["SAMPLING_WITH_TOOLS", "CommandSampler", "SamplingAnswer", "declined", "request_json"]

logger = logging.getLogger(__name__)

#: The capability to declare beside a sampler of this package: sampling, tool use included.
SAMPLING_WITH_TOOLS = SamplingCapability(tools=SamplingToolsCapability())
SamplingAnswer = CreateMessageResult | CreateMessageResultWithTools
DEFAULT_TIMEOUT_S = 600.0  # a local model may need minutes for one long answer
MAX_STDERR_CHARS = 500


def declined(reason: str) -> CreateMessageResult:
    """A declined answer (see the module docstring), logged as a warning."""
    logger.warning("sampling request declined: %s", reason)
    return CreateMessageResult.model_validate(declined_sampling(reason))


def request_json(params: CreateMessageRequestParams) -> dict[str, Any]:
    """The request as the wire has it: `{"method": "sampling/createMessage", "params": {...}}`."""
    dumped = params.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {"method": "sampling/createMessage", "params": dumped}


def parse_answer(params: dict[str, Any], raw: Any) -> SamplingAnswer:
    """`raw` as the answer to a request with `params` (tool use allowed only when it offered tools).

    Raises:
        pydantic.ValidationError: `raw` is not such a result.
    """
    answer: SamplingAnswer = sampling_answer_model(params).model_validate(raw)
    return answer


class CommandSampler:
    """Answers sampling requests by running `command` once per request.

    The program reads the request (`{"method": "sampling/createMessage", "params": {...}}`) as JSON
    on stdin and writes the result (a `CreateMessageResult`, with `tool_use` content when the
    request offered tools) as JSON on stdout; exit status 0. Anything else is a declined answer.

    Args:
        command: the program and its arguments, or one string split like a shell would (no shell runs).
        timeout: seconds the program may take per request.
    """

    def __init__(self, command: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise ValueError("the sampling command is empty")
        self.timeout = timeout

    async def __call__(self, context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingAnswer:
        request = request_json(params)
        try:
            with anyio.fail_after(self.timeout):
                done = await anyio.run_process(self.argv, input=json.dumps(request).encode(), check=False)
        except TimeoutError:
            return declined(f"the sampling command did not answer within {self.timeout:g} s")
        except OSError as exc:
            return declined(f"the sampling command could not run: {exc}")
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace").strip()[-MAX_STDERR_CHARS:]
            return declined(f"the sampling command exited with status {done.returncode}: {stderr or 'no message'}")
        try:
            return parse_answer(request["params"], json.loads(done.stdout))
        except (ValueError, pydantic.ValidationError) as exc:
            return declined(f"the sampling command's output is not a sampling result: {str(exc)[:MAX_STDERR_CHARS]}")
