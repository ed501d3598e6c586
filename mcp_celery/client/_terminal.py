"""What `mcp-celery call` shows and asks at the terminal: a live progress line and typed prompts.

Everything goes to stderr, so stdout carries only the result (`--json | jq` works). Prompts block on
`input()`, so they run in a worker thread while the progress line is paused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import anyio
from mcp.client import ClientRequestContext
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequestParams,
    ElicitResult,
    TextContent,
    ToolUseContent,
)
from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm, FloatPrompt, IntPrompt, Prompt
from rich.text import Text

from mcp_celery.client._sampling import SamplingAnswer, declined
from mcp_celery.protocol import DetailedTask

__all__ = ["Progress", "ask_yes_no", "elicit_at_terminal", "sample_at_terminal"]

SHOWN_CHARS = 2000  # of each block of the conversation's last message
#: Lines of the task's live output shown under the progress line at a terminal.
OUTPUT_LINES = 8

_COLOURS = {"working": "cyan", "input_required": "yellow", "completed": "green", "failed": "red", "cancelled": "red"}


def _elapsed_since(created_at: str | None, fallback: float) -> float:
    try:
        return time.time() - datetime.fromisoformat(created_at).timestamp() if created_at else time.time() - fallback
    except ValueError:
        return time.time() - fallback


class Progress:
    """`⠙ working · step 12 · 3.4s` on a terminal, the live output's last lines under it; elsewhere one plain
    line per change, and each line of output as it comes."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.task: DetailedTask | None = None
        self.note = ""
        self._since = time.time()
        self._last_line = ""
        self._status = console.status("", spinner="dots") if console.is_terminal else None
        self._output: deque[str] = deque(maxlen=OUTPUT_LINES)

    def output(self, line: str) -> None:
        """One line of the task's live output: under the progress line on a terminal (its last few), else printed."""
        if self._status is None:
            self.console.print(line, markup=False, highlight=False, emoji=False)
            return
        self._output.append(line)
        self.refresh()

    def line(self) -> str:
        if self.task is None:
            return f"starting · {_elapsed_since(None, self._since):.1f}s"
        task = self.task
        parts = [f"[{_COLOURS.get(task.status, 'white')}]{task.status}[/]"]
        parts += [escape(text) for text in (task.status_message, self.note) if text]
        return " · ".join([*parts, f"{_elapsed_since(task.created_at, self._since):.1f}s"])

    def update(self, task: DetailedTask) -> None:
        self.task = task
        self.refresh()

    def refresh(self) -> None:
        if self._status is not None:
            under = "".join(f"\n[dim]{escape(text[: self.console.width - 4])}[/]" for text in self._output)
            self._status.update(self.line() + under)
            return
        line = self.line().rsplit(" · ", 1)[0]  # without the elapsed time, which changes every time
        if self.task is not None and line != self._last_line:
            self._last_line = line
            self.console.print(line)

    async def tick(self) -> None:
        while True:
            self.refresh()
            await anyio.sleep(0.2)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if self._status is not None:
            self._status.start()
        try:
            yield
        finally:
            if self._status is not None:
                self._status.stop()

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        if self._status is not None:
            self._status.stop()
        try:
            yield
        finally:
            if self._status is not None:
                self._status.start()


def _yes_unless_no(console: Console, question: str) -> bool:
    while True:
        answer = console.input(Text(f"{question} [Y/n] ")).strip().lower()  # Text: no markup, no highlighting
        if answer in ("", "y", "yes"):
            return True
        if answer in ("n", "no"):
            return False


async def ask_yes_no(progress: Progress, question: str) -> bool:
    """`question [Y/n]` with the progress line paused; Enter means yes."""
    async with progress.paused():
        answer: bool = await anyio.to_thread.run_sync(_yes_unless_no, progress.console, question)
    return answer


def _ask_field(console: Console, name: str, schema: dict[str, Any], required: bool) -> Any:
    """One typed, validated answer for one property of a form schema; None for a skipped optional field."""
    title = escape(str(schema.get("title") or name))
    if description := schema.get("description"):
        title += f" [dim]({escape(str(description))})[/]"
    default = schema.get("default")
    kind = schema.get("type")
    if kind == "boolean":
        return Confirm.ask(title, console=console, default=default if isinstance(default, bool) else ...)
    if kind in ("integer", "number"):
        return _ask_number(console, title, schema, integer=kind == "integer")
    return _ask_text(console, title, schema, required)


def _ask_number(console: Console, title: str, schema: dict[str, Any], integer: bool) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    default = schema.get("default", ...)
    while True:  # IntPrompt/FloatPrompt re-ask until the input parses; the bounds are checked here
        value: float = (IntPrompt if integer else FloatPrompt).ask(title, console=console, default=default)
        if (low is None or value >= low) and (high is None or value <= high):
            return value
        console.print(f"[red]a number from {low} to {high}, please[/]")


def _ask_text(console: Console, title: str, schema: dict[str, Any], required: bool) -> str | None:
    choices = [str(c) for c in schema.get("enum") or [o["const"] for o in schema.get("oneOf") or [] if "const" in o]]
    shortest, longest = schema.get("minLength", 1 if required else 0), schema.get("maxLength", 1 << 30)
    default = schema.get("default") or ("" if not required else ...)
    while True:  # Prompt re-asks until the input is one of the choices; the length is checked here
        value = str(Prompt.ask(title, console=console, choices=choices or None, default=default))
        if value == "" and not required:
            return None
        if shortest <= len(value) <= longest:
            return value
        console.print(f"[red]from {shortest} to {longest} characters, please[/]")


def ask_form(console: Console, params: ElicitRequestParams) -> ElicitResult:
    console.print(f"[bold yellow]?[/] [bold]{escape(params.message)}[/]")
    schema: dict[str, Any] = dict(getattr(params, "requested_schema", None) or {})
    if getattr(params, "url", None):
        console.print(f"  open {params.url}")  # type: ignore[union-attr]
        return ElicitResult(action="accept" if Confirm.ask("done?", console=console) else "decline")
    required = set(schema.get("required") or [])
    content: dict[str, Any] = {}
    try:
        for name, field in (schema.get("properties") or {}).items():
            value = _ask_field(console, name, field, name in required)
            if value is not None:
                content[name] = value
    except EOFError:  # Ctrl-D: the user does not want to answer
        return ElicitResult(action="decline")
    return ElicitResult(action="accept", content=content)


def elicit_at_terminal(progress: Progress) -> Any:
    """An SDK `elicitation_callback` that asks at this terminal, with the progress line paused."""
    return _at_terminal(progress, ask_form)


def _at_terminal(progress: Progress, ask: Callable[[Console, Any], Any]) -> Any:
    """An SDK callback running the blocking prompt `ask(console, params)` in a thread, the progress line paused."""

    async def answer(ctx: ClientRequestContext, params: Any) -> Any:
        async with progress.paused():
            return await anyio.to_thread.run_sync(ask, progress.console, params)

    return answer


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} more characters]"


def _show_sampling(console: Console, params: CreateMessageRequestParams) -> None:
    """The request as a person needs it: the system prompt, the tools, and the conversation's last message."""
    console.print("[bold yellow]?[/] [bold]The server asks for a completion (sampling): you answer as the model.[/]")
    if params.system_prompt:
        console.print(f"[dim]system:[/] {escape(_cut(params.system_prompt, 400))}")
    if params.tools:
        console.print(f"[dim]tools:[/] {escape(', '.join(tool.name for tool in params.tools))}")
    for block in params.messages[-1].content_as_list if params.messages else []:
        if block.type == "text":
            console.print(Text(_cut(block.text)))
        elif block.type == "tool_result":
            texts = " ".join(part.text for part in block.content if isinstance(part, TextContent))
            console.print(
                Text(f"[tool result {block.tool_use_id}{' (error)' if block.is_error else ''}] {_cut(texts)}")
            )
        elif block.type == "tool_use":
            console.print(Text(f"[tool use {block.name}] {json.dumps(block.input)}"))
        else:
            console.print(f"[dim]({block.type} content)[/]")


def ask_sampling(console: Console, params: CreateMessageRequestParams) -> SamplingAnswer:
    """One typed reply: text, or `/tool NAME {json}` when the request offers tools; Ctrl-D declines."""
    _show_sampling(console, params)
    tools = {tool.name for tool in params.tools or []}
    hint = " (or /tool NAME {json arguments})" if tools else ""
    while True:
        try:
            line = console.input(Text(f"reply{hint}: ")).strip()
        except EOFError:
            return declined("the user declined at the terminal")
        if tools and line.startswith("/tool "):
            name, _, raw = line.removeprefix("/tool ").strip().partition(" ")
            try:
                arguments = json.loads(raw or "{}")
            except ValueError:
                arguments = None
            if name not in tools or not isinstance(arguments, dict):
                console.print(f"[red]/tool NAME {{json object}}, NAME one of: {escape(', '.join(sorted(tools)))}[/]")
                continue
            use = ToolUseContent(name=name, id=f"typed-{uuid.uuid4().hex[:12]}", input=arguments)
            return CreateMessageResultWithTools(role="assistant", content=[use], model="typed", stop_reason="toolUse")
        if line:
            content = TextContent(type="text", text=line)
            return CreateMessageResult(role="assistant", content=content, model="typed", stop_reason="endTurn")


def sample_at_terminal(progress: Progress) -> Any:
    """An SDK `sampling_callback` that asks the person at this terminal, with the progress line paused."""
    return _at_terminal(progress, ask_sampling)
