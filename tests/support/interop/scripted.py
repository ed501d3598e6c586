"""The cases of the interop suite and the scripted model that plays them (standard library only).

Each driver (`run_*.py`) runs in the virtualenv of its client library and plays every case through
the library's own tool layer: the agent's loop with the library's test model where it ships one,
else the tool object its agents call. The model's part is played here, by `Model`, which reads
only what the library shows a model of each result (`seen`: the text, or the structuredContent
as JSON), finds the next call there (`nextCall`, or "task_status with {...}" in the words), puts
real answers in place of the example ones, and stops when a result names no next call. So a case
passes only if what the library shows its model is enough to reach the job's result.

A driver prints one JSON object per case (`Outcome`); tests/e2e/test_interop.py checks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

#: The answers the model (or the library's elicitation handler) gives, in the order asked.
NAMES = ("Ann", "Bob")
#: How many calls a case may take before the model gives up.
MAX_CALLS = 40


@dataclass(frozen=True)
class Case:
    tool: str
    arguments: dict[str, Any]
    #: What the final text must hold.
    expect: str
    #: Cancel the job as soon as a result names it (with task_cancel, or the library's own cancel).
    cancel: bool = False


#: The cases, each on the session's sample jobs (tests/support/sample_jobs.py), on a server with the default
#: inline window (20 s; a client's own window below that: MCP_CELERY_CLIENT_WINDOWS).
CASES: dict[str, Case] = {
    "short": Case("slow_greeting", {"name": "Ada", "seconds": 0.5}, "Hello, Ada!"),
    "long": Case("slow_greeting", {"name": "Bo", "seconds": 8}, "Hello, Bo!"),
    "asks": Case("ask_early_and_late", {"late_after_s": 6}, "Ann and Bob"),
    "cancel": Case("slow_greeting", {"name": "Dee", "seconds": 60}, "cancelled", cancel=True),
    "twelve": Case("slow_greeting", {"name": "Cy", "seconds": 12}, "Hello, Cy!"),
}

_NAMED_CALL = re.compile(r"\b(task_status|task_respond|task_cancel) with (?=\{)")


def next_call(seen: str) -> tuple[str, dict[str, Any]] | None:
    """The call a result names as the next one: its `nextCall` field when the model sees JSON, else the first
    "TOOL with {...}" of its words; None when it names none (the task has ended, or this is the tool's result)."""
    try:
        shown = json.loads(seen)
    except ValueError:
        shown = None
    if isinstance(shown, dict):
        call = shown.get("nextCall")
        return (str(call["tool"]), dict(call["arguments"])) if isinstance(call, dict) else None
    match = _NAMED_CALL.search(seen)
    if match is None:
        return None
    arguments, _ = json.JSONDecoder().raw_decode(seen, match.end())
    return match.group(1), dict(arguments)


@dataclass
class Outcome:
    """What a case did, as a driver reports it."""

    library: str
    case: str
    final: str = ""
    #: The tools the model called, in order (the case's own tool first).
    calls: list[str] = field(default_factory=list)
    #: What the model saw of each result, cut to 2000 characters each.
    seen: list[str] = field(default_factory=list)
    #: Questions the library answered itself (its elicitation handler), without the model.
    answered_in_band: int = 0
    seconds: float = 0.0
    error: str | None = None

    def line(self) -> str:
        return json.dumps(asdict(self))


class Model:
    """Plays one case: the first call, then each next call from what the model saw of the last result."""

    def __init__(self, library: str, name: str) -> None:
        self.case = CASES[name]
        self.outcome = Outcome(library, name)
        self._answers = iter(NAMES)
        self._cancelled = False
        self._started = time.monotonic()

    def first(self) -> tuple[str, dict[str, Any]]:
        self.outcome.calls.append(self.case.tool)
        return self.case.tool, dict(self.case.arguments)

    def next(self, seen: str) -> tuple[str, dict[str, Any]] | None:
        """The next call after a result the model saw as `seen`; None: `seen` is the final answer."""
        self.outcome.seen.append(seen[:2000])
        call = next_call(seen)
        if call is None or len(self.outcome.calls) >= MAX_CALLS:
            self.finish(seen)
            return None
        tool, arguments = call
        if self.case.cancel and not self._cancelled and "task_id" in arguments:
            self._cancelled = True
            tool, arguments = "task_cancel", {"task_id": arguments["task_id"]}
        elif tool == "task_respond":
            arguments["responses"] = {key: self.answer(example) for key, example in arguments["responses"].items()}
        self.outcome.calls.append(tool)
        return tool, arguments

    def answer(self, example: dict[str, Any]) -> dict[str, Any]:
        """The example answer of a question, with the next real name in place of its placeholder."""
        return {"action": "accept", "content": {key: next(self._answers) for key in example.get("content") or {}}}

    def elicited(self) -> dict[str, str]:
        """What a library's elicitation handler answers (the question never reaches the model)."""
        self.outcome.answered_in_band += 1
        return {"name": next(self._answers)}

    def wants_cancel(self) -> bool:
        """For a library's own task handle: cancel it now (once)."""
        if self.case.cancel and not self._cancelled:
            self._cancelled = True
            return True
        return False

    @contextlib.contextmanager
    def playing(self) -> Iterator[None]:
        """Around a case's calls: an exception ends the case, as its error."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - reported as the case's error
            self.finish(self.outcome.final, f"{type(exc).__name__}: {exc}")

    def finish(self, final: str, error: str | None = None) -> None:
        self.outcome.final = final
        self.outcome.error = error
        self.outcome.seconds = round(time.monotonic() - self._started, 1)


def text_of(blocks: Any) -> str:
    """The text of a result's content blocks (objects with a `text`), as a model is shown them."""
    return "\n".join(str(getattr(block, "text", "")) for block in blocks)


def main(play: Callable[..., Awaitable[str]], options: int = 0) -> None:
    """A driver's command line, `URL [OPTION...] CASE...`: `play(url, *options, case)` for each case in turn,
    printing its outcome line."""

    async def every_case() -> None:
        url, chosen = sys.argv[1], sys.argv[2 : 2 + options]
        for name in sys.argv[2 + options :]:
            print(await play(url, *chosen, name), flush=True)

    asyncio.run(every_case())
