"""The review sub-agent's loop: sample the client's model, run the tools it asks for, until it submits its review.

Each turn is one sampling request holding the whole conversation so far (sampling is stateless:
the client's model sees only what the request carries), the tools as sampling tools and
`toolChoice`. An answer with `tool_use` blocks is appended as the assistant's message, the
tools run on the worker, and their `tool_result`s go back as the next user message. The loop
ends when the model calls `submit_review` or answers in text alone (its final review), or when
`max_turns` runs out: the last turn offers the tools with `toolChoice: none` and says it is the
last, so a model that follows instructions answers then. A client that cannot or will not
sample (the capability not declared, a declined answer, no answer in time) ends the loop too,
and the outcome says so; whatever the model found before that is kept.

No Celery here: the job passes `sample` and `status` (both cancel checkpoints in a real job).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp_types import CreateMessageResult, CreateMessageResultWithTools
from pydantic import ValidationError

import mcp_celery
from jobs._findings import Finding
from jobs._review_tools import SUBMIT, ReviewSubmission, Toolbox
from mcp_celery.inputs import SAMPLING_DECLINED, SAMPLING_USAGE_META, ToolChoiceMode

__all__ = ["AgentOutcome", "ReviewAgent", "Sampler", "parse_review"]

#: (messages, tools or None, toolChoice mode or None, system prompt) -> the model's answer.
Sampler = Callable[
    [list[dict[str, Any]], list[dict[str, Any]] | None, ToolChoiceMode | None, str],
    CreateMessageResult | CreateMessageResultWithTools,
]
State = Literal["completed", "max_turns", "skipped", "stopped"]
LAST_TURN = (
    "\n\nThis is your last turn: you cannot use tools any more. Answer now with your final review as a "
    'JSON object {"summary": ..., "findings": [...]} in a ```json block.'
)
MAX_CONVERSATION_CHARS = 200_000  # older tool outputs are elided past this: local models have small contexts
ELIDED = "[output elided to keep the conversation short; call the tool again if you need it]"
CHARS_PER_TOKEN = 4  # the usual estimate, when the client does not report the model's usage
_JSON_BLOCK = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


@dataclass
class AgentOutcome:
    state: State = "skipped"
    note: str | None = None
    summary: str = ""
    findings: list[Finding] = field(default_factory=list)
    dropped: int = 0  # findings the model gave for files that are not in the repository
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tokens_estimated: bool = False
    model: str | None = None


class ReviewAgent:
    """One review's conversation with the client's model.

    Args:
        toolbox: the tools the model may call.
        sample: asks the model (see `Sampler`); raises InputNotSupported or InputTimeout when it cannot.
        status: shows progress ("turn 3/8: reading src/app.py lines 1-80").
        max_turns: sampling requests at most.
        is_repo_file: whether a finding's file exists in the repository (others are dropped).
    """

    def __init__(
        self,
        toolbox: Toolbox,
        sample: Sampler,
        status: Callable[[str], None],
        max_turns: int,
        is_repo_file: Callable[[str], bool],
    ) -> None:
        self.toolbox, self.sample, self.status, self.max_turns = toolbox, sample, status, max_turns
        self.is_repo_file = is_repo_file
        self.outcome = AgentOutcome()
        self.messages: list[dict[str, Any]] = []

    def run(self, brief: str, system: str, *, use_tools: bool) -> AgentOutcome:
        """Run the loop from the first user message `brief`; returns how it ended."""
        self.messages = [{"role": "user", "content": {"type": "text", "text": brief}}]
        tools = self.toolbox.definitions() if use_tools else None
        for turn in range(1, self.max_turns + 1):
            last = turn == self.max_turns
            self.status(f"turn {turn}/{self.max_turns}: waiting for the model")
            choice: ToolChoiceMode | None = ("none" if last else "auto") if use_tools else None
            answer = self._ask(tools, choice, system + (LAST_TURN if last and use_tools else ""))
            if answer is None:
                return self.outcome
            if self._take(answer, turn, last):
                return self.outcome
        return self.outcome  # not reached: the last turn always ends the loop

    def _ask(
        self, tools: list[dict[str, Any]] | None, choice: ToolChoiceMode | None, system: str
    ) -> CreateMessageResult | CreateMessageResultWithTools | None:
        try:
            answer = self.sample(self.messages, tools, choice, system)
        except mcp_celery.InputNotSupported as exc:
            return self._give_up(f"the client cannot sample: {exc}")
        except mcp_celery.InputTimeout as exc:
            return self._give_up(f"the client's model did not answer in time ({exc})")
        self._count(answer, tools, system)
        if answer.stop_reason == SAMPLING_DECLINED:
            return self._give_up(f"the client declined to sample: {_text(answer) or 'no reason given'}")
        return answer

    def _give_up(self, why: str) -> None:
        self.outcome.state = "skipped" if self.outcome.turns == 0 else "stopped"
        self.outcome.note = why
        return None

    def _take(self, answer: CreateMessageResult | CreateMessageResultWithTools, turn: int, last: bool) -> bool:
        """Act on one answer; True when the review is over."""
        self.outcome.turns, self.outcome.model = turn, answer.model
        blocks = answer.content if isinstance(answer.content, list) else [answer.content]
        uses = [block for block in blocks if block.type == "tool_use"]
        if not uses:
            return self._finish_with_text(_text(answer))
        submit = next((use for use in uses if use.name == SUBMIT), None)
        if submit is not None and self._submitted(submit.input):
            return True
        if last:
            self.outcome.state = "max_turns"
            self.outcome.note = f"the model was still using tools after {self.max_turns} turns"
            self.outcome.summary = self.outcome.summary or _text(answer)
            return True
        self.messages.append({"role": "assistant", "content": [_dump(block) for block in blocks]})
        results = [self._run_tool(turn, use.id, use.name, use.input) for use in uses]
        self.messages.append({"role": "user", "content": results})
        self._trim()
        return False

    def _run_tool(self, turn: int, use_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == SUBMIT:  # reached only when the submission did not validate
            output_text, is_error = f"{SUBMIT}: the review does not match the tool's inputSchema", True
        else:
            self.status(f"turn {turn}/{self.max_turns}: {self.toolbox.describe(name, arguments)}")
            output = self.toolbox.run(name, arguments)
            output_text, is_error = output.text, output.is_error
        return {
            "type": "tool_result",
            "toolUseId": use_id,
            "content": [{"type": "text", "text": output_text}],
            **({"isError": True} if is_error else {}),
        }

    def _submitted(self, arguments: dict[str, Any]) -> bool:
        try:
            submission = ReviewSubmission.model_validate(arguments)
        except ValidationError:
            return False
        self._accept(submission)
        return True

    def _finish_with_text(self, text: str) -> bool:
        submission = parse_review(text)
        self._accept(submission if submission is not None else ReviewSubmission(summary=text.strip()))
        return True

    def _accept(self, submission: ReviewSubmission) -> None:
        self.outcome.state, self.outcome.summary = "completed", submission.summary.strip()
        for finding in submission.findings:
            name = finding.file.strip().removeprefix("./")
            if not self.is_repo_file(name):
                self.outcome.dropped += 1
                continue
            self.outcome.findings.append(Finding(**finding.model_dump(exclude={"file"}), file=name, source="model"))

    def _count(self, answer: Any, tools: list[dict[str, Any]] | None, system: str) -> None:
        usage = (answer.meta or {}).get(SAMPLING_USAGE_META)
        if isinstance(usage, dict) and isinstance(usage.get("inputTokens"), int):
            self.outcome.input_tokens += usage["inputTokens"]
            self.outcome.output_tokens += int(usage.get("outputTokens") or 0)
            return
        self.outcome.tokens_estimated = True
        sent = len(json.dumps(self.messages)) + len(system) + len(json.dumps(tools or []))
        self.outcome.input_tokens += sent // CHARS_PER_TOKEN
        self.outcome.output_tokens += len(json.dumps(_dump_content(answer))) // CHARS_PER_TOKEN

    def _trim(self) -> None:
        """Elide the oldest tool outputs while the conversation is over MAX_CONVERSATION_CHARS."""
        for message in self.messages[1:-1]:
            if len(json.dumps(self.messages)) <= MAX_CONVERSATION_CHARS:
                return
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result":
                    block["content"] = [{"type": "text", "text": ELIDED}]


def parse_review(text: str) -> ReviewSubmission | None:
    """The review in a text answer: a JSON object (in a ```json block, or the whole text), else None."""
    candidates = [match.group(1) for match in _JSON_BLOCK.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return ReviewSubmission.model_validate(json.loads(candidate))
        except (ValueError, ValidationError):
            continue
    return None


def _text(answer: CreateMessageResult | CreateMessageResultWithTools) -> str:
    blocks = answer.content if isinstance(answer.content, list) else [answer.content]
    return "\n".join(block.text for block in blocks if block.type == "text").strip()


def _dump(block: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


def _dump_content(answer: CreateMessageResult | CreateMessageResultWithTools) -> list[dict[str, Any]]:
    blocks = answer.content if isinstance(answer.content, list) else [answer.content]
    return [_dump(block) for block in blocks]
