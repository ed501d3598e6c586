"""`mcp-celery call` and `mcp-celery tasks list|get|wait|cancel`: the task client at a terminal. Wiring only.

The exit statuses of `call` and `tasks wait` are EXIT_STATUSES; the other commands exit 0, or 2
when they cannot do what was asked.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mcp_celery.client._artifacts import save_artifacts
from mcp_celery.client._errors import NotATaskError
from mcp_celery.client._extension import TasksExtension, connect
from mcp_celery.client._handle import TaskHandle
from mcp_celery.client._journal import Journal, ServerTarget
from mcp_celery.client._openai import API_KEY_ENV, OpenAISampler
from mcp_celery.client._output import OutputFollower
from mcp_celery.client._retries import DEFAULT_RETRIES, Retries
from mcp_celery.client._sampling import DEFAULT_TIMEOUT_S, SAMPLING_WITH_TOOLS, CommandSampler
from mcp_celery.client._terminal import Progress, ask_yes_no, elicit_at_terminal, sample_at_terminal
from mcp_celery.errors import McpCeleryError
from mcp_celery.protocol import DetailedTask

__all__ = ["EXIT_STATUSES", "TOKEN_ENV", "main", "parser", "register", "split_argv"]

TOKEN_ENV = "MCP_CELERY_TOKEN"
EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 2, 3, 4
#: What each exit status of `call` and `tasks wait` means.
EXIT_STATUSES = {
    EXIT_OK: "the task completed and the tool succeeded",
    EXIT_TOOL_ERROR: "the task completed with a tool error (`isError: true`)",
    EXIT_USAGE: "usage error, or the server could not be reached or refused a request",
    EXIT_FAILED: "the task failed (a JSON-RPC error)",
    EXIT_CANCELLED: "the task was cancelled",
}


#: The `tasks` actions that take a task id, and what each does.
TASK_ACTIONS = {"get": "its status now", "wait": "wait for it as call does", "cancel": "cancel it"}


def parser() -> argparse.ArgumentParser:
    """The parser of `mcp-celery call|tasks ...`: the words after `call`'s `--` are not parsed (the stdio command)."""
    root = argparse.ArgumentParser(prog="mcp-celery", description="A client for SEP-2663 task servers.")
    root.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    register(root.add_subparsers(dest="command", required=True))
    return root


def register(commands: Any) -> None:
    """Add `call` and `tasks` to an argparse subparsers object."""
    call = commands.add_parser("call", help="call a tool as a task: progress, questions, Ctrl-C to cancel")
    call.add_argument("tool", help="the tool's name, as tools/list gives it")
    call.add_argument("--args", default="{}", help="the tool's arguments as a JSON object")
    call.add_argument("--url", help="Streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp")
    call.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES.attempts,
        metavar="N",
        help="send the call again with its idempotency key up to N times when its reply is lost over HTTP, "
        f"if the server honours keys (default {DEFAULT_RETRIES.attempts}; 0: never)",
    )
    call.set_defaults(server_command=[])
    call.epilog = "Start a stdio server instead of --url: mcp-celery call TOOL --args '{...}' -- COMMAND ARGS..."
    _common(call)
    _output_options(call)
    _sampling_options(call)
    tasks = commands.add_parser("tasks", help="the tasks in the local journal")
    actions = tasks.add_subparsers(dest="action", required=True)
    _common(actions.add_parser("list", help="the newest tasks, newest first"))
    for action, text in TASK_ACTIONS.items():
        parser = actions.add_parser(action, help=text)
        parser.add_argument("task_id", help="a task id from `tasks list` (a unique prefix is enough)")
        _task_options(parser, action)


def _task_options(parser: argparse.ArgumentParser, action: str) -> None:
    _common(parser)
    if action == "wait":
        _output_options(parser)
        _sampling_options(parser)
    if action == "get":
        parser.add_argument(
            "--save", metavar="DIR", help="download every artifact the task's result links into DIR (made if missing)"
        )


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (default ${TOKEN_ENV})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--journal", help="journal file (default $MCP_CELERY_CLIENT_JOURNAL or the data dir)")


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show the task's live output under the progress line (default: on)",
    )
    parser.add_argument("--quiet", dest="output", action="store_false", help="no live output (as --no-output)")


def _sampling_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "sampling (a job asks the client's model)",
        "At a terminal you type the model's answers, unless one of these answers them (or --no-sampling).",
    )
    group.add_argument(
        "--sampling-url",
        metavar="URL",
        help="an OpenAI-compatible chat-completions endpoint, e.g. "
        f"http://127.0.0.1:11434/v1 (Ollama); a key, if it needs one, in ${API_KEY_ENV}",
    )
    group.add_argument("--sampling-model", metavar="NAME", help="the model at --sampling-url, e.g. qwen2.5-coder:7b")
    group.add_argument(
        "--sampling-command",
        metavar="CMD",
        help="a program that reads each request as JSON on stdin and writes the result on stdout",
    )
    group.add_argument(
        "--sampling-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"longest wait for one answer (default {DEFAULT_TIMEOUT_S:g})",
    )
    group.add_argument("--no-sampling", action="store_true", help="do not offer sampling, even at a terminal")


def _sampling(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """The `connect()` options that answer sampling requests; none when this client offers no sampling."""
    url, command, model = (getattr(args, f"sampling_{name}", None) for name in ("url", "command", "model"))
    if url and command:
        raise ValueError("give --sampling-url or --sampling-command, not both")
    if model and not url:
        raise ValueError("--sampling-model names the model at --sampling-url; give that too")
    timeout = getattr(args, "sampling_timeout", DEFAULT_TIMEOUT_S)
    if url:
        callback: Any = OpenAISampler(url, model or "", timeout=timeout)
    elif command:
        callback = CommandSampler(command, timeout=timeout)
    elif sys.stdin.isatty() and progress.console.is_terminal and not getattr(args, "no_sampling", False):
        callback = sample_at_terminal(progress)
    else:
        return {}
    return {"sampling_callback": callback, "sampling_capabilities": SAMPLING_WITH_TOOLS}


def main(argv: list[str]) -> int:
    """Run `call ...` or `tasks ...` (argv without the program name); returns the exit status."""
    words, server_command = split_argv(argv)
    args = parser().parse_args(words)
    args.server_command = server_command
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    console = Console(stderr=True, soft_wrap=True)
    try:
        journal = Journal(args.journal)
        if args.command == "call":
            return anyio.run(_call, args, journal, console)
        if args.action == "list":
            return _list(journal, args.json)
        return anyio.run(_task_command, args, journal, console)
    except Exception as exc:  # the command's boundary: one line for the user; the traceback at --log-level DEBUG
        console.print(f"mcp-celery: {escape(_describe(exc))}")
        logging.getLogger(__name__).debug("the command failed", exc_info=True)
    return EXIT_USAGE


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The words `parser()` reads, and the stdio server command after `call`'s `--` (else empty)."""
    argv = list(argv)
    if argv[:1] == ["call"] and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return task_id_last(argv), []


def task_id_last(argv: list[str]) -> list[str]:
    """ARGV, with the id of `tasks get|wait|cancel ID` moved behind a `--` when it starts with `-`.

    Ids are opaque: ours and FastMCP's come from `secrets.token_urlsafe`, so one in 64 starts with `-`,
    and argparse would read such an id as options (`-h...` as --help). The id is the first word that is
    neither one of the action's options nor an option's value.
    """
    if len(argv) < 3 or argv[0] != "tasks" or argv[1] not in TASK_ACTIONS or "--" in argv:
        return argv
    takes_value = _option_arity(argv[1])
    at = 2
    while at < len(argv):
        name, equals, _ = argv[at].partition("=")
        if name in takes_value:
            at += 2 if takes_value[name] and not equals else 1
        elif argv[at].startswith("-"):
            return [*argv[:at], *argv[at + 1 :], "--", argv[at]]
        else:
            return argv
    return argv


def _option_arity(action: str) -> dict[str, bool]:
    """Each option string of `tasks ACTION`, and whether it takes a value."""
    sub = argparse.ArgumentParser()
    _task_options(sub, action)
    # argparse keeps no public index of its options; this one has been stable since Python 2.7.
    return {name: act.nargs != 0 for name, act in sub._option_string_actions.items()}


class RefusedError(McpCeleryError):
    """The server refused a request over HTTP before JSON-RPC (401, 403, 413, 421); the message says why."""


#: What an HTTP refusal means for the person at the terminal.
REFUSED = {
    401: f"401: the server refused the token (--token or {TOKEN_ENV})",
    403: "403: the server refused the request (the token's scope, or an Origin it does not accept)",
    413: "413: the request is larger than the server accepts (its MCP_CELERY_MAX_REQUEST_BYTES)",
    421: "421: the server does not answer to the host name in --url (its MCP_CELERY_ALLOWED_HOSTS)",
}


def _refused(status: int, token: str | None) -> RefusedError:
    if status == 401 and not token:
        return RefusedError(f"401: this server needs a token (--token or {TOKEN_ENV})")
    return RefusedError(REFUSED.get(status, f"{status}: the server refused the request"))


@asynccontextmanager
async def _explaining_refusals(extension: TasksExtension, token: str | None) -> AsyncIterator[None]:
    """Turn the SDK's -32603 for an HTTP 401/403 into the refusal it was."""
    try:
        yield
    except Exception as exc:
        if extension.state.http_refusal is None:
            raise
        raise _refused(extension.state.http_refusal, token) from exc


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # task groups wrap what they raise
        exc = exc.exceptions[0]
    if isinstance(exc, RefusedError):
        return str(exc)
    if isinstance(exc, KeyError):
        return str(exc.args[0])
    if isinstance(exc, MCPError):
        return f"the server answered with error {exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _target(args: argparse.Namespace) -> ServerTarget:
    command = args.server_command
    if bool(args.url) == bool(command):
        raise ValueError("give either --url URL or -- COMMAND ARGS... (a stdio server)")
    return ServerTarget(url=args.url) if args.url else ServerTarget(command=tuple(command), cwd=os.getcwd())


async def _call(args: argparse.Namespace, journal: Journal, console: Console) -> int:
    arguments = json.loads(args.args)
    if not isinstance(arguments, dict):
        raise ValueError("--args must be a JSON object")
    target = _target(args)
    extension = TasksExtension(journal=journal, target=target)
    progress = Progress(console)
    answering = {"elicitation_callback": elicit_at_terminal(progress), **_sampling(args, progress)}
    async with (
        _explaining_refusals(extension, args.token),
        connect(target, extension, token=args.token, retries=Retries(attempts=args.retries), **answering) as c,
    ):
        try:
            handle = await extension.start(c, args.tool, arguments)
        except NotATaskError as inline:
            return _print_result(inline.result, args.json)
        console.print(f"task [bold]{handle.task_id}[/] started (resume with: mcp-celery tasks wait {handle.task_id})")
        return _report(await _watch(handle, progress, args.output), args.json, console)


async def _task_command(args: argparse.Namespace, journal: Journal, console: Console) -> int:
    entry = journal.get(args.task_id)
    extension = TasksExtension(journal=journal, target=entry.target)
    progress = Progress(console)
    answering = {"elicitation_callback": elicit_at_terminal(progress), **_sampling(args, progress)}
    async with (
        _explaining_refusals(extension, args.token),
        connect(entry.target, extension, token=args.token, **answering) as client,
    ):
        handle = extension.attach(client, entry.task_id, entry.tool)
        if args.action == "cancel":
            await handle.cancel()
            task = await handle.status()  # what the cancel left: still running, cancelled, or ended before it
            print(_task_json(task) if args.json else _cancel_text(task))
            return EXIT_OK
        if args.action == "get":
            task = await handle.status()
            print(_task_json(task) if args.json else _task_text(task))
            if args.save:
                for path in await save_artifacts(task.result, entry.target, args.token, Path(args.save), client):
                    print(f"saved {path}", file=sys.stderr)
            return EXIT_OK
        return _report(await _watch(handle, progress, args.output), args.json, console)


async def _watch(handle: TaskHandle, progress: Progress, output: bool) -> DetailedTask:
    """Wait with the progress line (and, with `output`, the live output under it); Ctrl-C asks whether to
    cancel the task, then keeps waiting for its end."""
    follower = OutputFollower(handle.session, handle.task_id, progress.output) if output else None
    with anyio.open_signal_receiver(signal.SIGINT) as interrupts:
        async with progress.running():
            while (final := await _wait_until_interrupted(handle, progress, interrupts, follower)) is None:
                if await ask_yes_no(progress, "cancel the task?"):
                    await handle.cancel()
                    progress.note = "cancel requested"
            if follower is not None:
                await follower.catch_up(final=True)  # the lines written after the last update seen
            return final


async def _wait_until_interrupted(
    handle: TaskHandle, progress: Progress, interrupts: AsyncIterator[int], follower: OutputFollower | None
) -> DetailedTask | None:
    """The final state, or None when Ctrl-C came first."""
    final: list[DetailedTask] = []
    async with anyio.create_task_group() as group:
        if follower is not None:
            group.start_soon(follower.follow)

        async def wait() -> None:
            final.append(await handle.wait(on_update=progress.update))
            group.cancel_scope.cancel()

        async def interrupted() -> None:
            await anext(interrupts)
            group.cancel_scope.cancel()

        group.start_soon(wait)
        group.start_soon(interrupted)
        group.start_soon(progress.tick)
    return final[0] if final else None


def _report(task: DetailedTask, as_json: bool, console: Console) -> int:
    """Print the final state (the DetailedTask with `--json`); returns the exit status for it."""
    result = task.call_tool_result() if task.status == "completed" else None
    if as_json:
        print(_task_json(task))
    elif task.status == "failed":
        error = task.error
        console.print(
            f"[red]failed[/]: {error.message if error else task.status_message} ({error.code if error else ''})"
        )
    elif task.status == "cancelled":
        console.print(f"[red]cancelled[/]{': ' + escape(task.status_message) if task.status_message else ''}")
    elif result is not None:
        _print_text(result)
    if task.status == "cancelled":
        return EXIT_CANCELLED
    if result is None:  # failed, or a completed task without a result
        return EXIT_FAILED
    return EXIT_TOOL_ERROR if result.is_error else EXIT_OK


def _print_result(result: CallToolResult, as_json: bool) -> int:
    """A result the server gave inline, without a task: with `--json` in the final task's shape, without an id."""
    if as_json:
        inline = {"taskId": None, "status": "completed", "result": result.model_dump(by_alias=True, exclude_none=True)}
        print(json.dumps(inline))
    else:
        _print_text(result)
    return EXIT_TOOL_ERROR if result.is_error else EXIT_OK


def _print_text(result: CallToolResult) -> None:
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if texts:
        print("\n".join(texts))
    elif result.structured_content is not None:
        print(json.dumps(result.structured_content, indent=2))
    if result.is_error:
        print("(tool error)", file=sys.stderr)


def _task_json(task: DetailedTask) -> str:
    return task.model_dump_json(by_alias=True, exclude_none=True)


def _cancel_text(task: DetailedTask) -> str:
    if task.terminal and task.status != "cancelled":
        return f"{task.task_id} had already ended {task.status}: the cancel changed nothing"
    return f"cancel requested: {_task_text(task)}"


def _task_text(task: DetailedTask) -> str:
    lines = [f"{task.task_id}  {task.status}  {task.status_message or ''}".rstrip()]
    if task.status == "completed" and (result := task.call_tool_result()) is not None:
        lines += [b.text for b in result.content if isinstance(b, TextContent)]
    if task.error is not None:
        lines.append(f"error {task.error.code}: {task.error.message}")
    return "\n".join(lines)


def _list(journal: Journal, as_json: bool) -> int:
    entries = journal.entries()
    if as_json:
        rows = [{"taskId": e.task_id, "tool": e.tool, "status": e.status, "statusMessage": e.status_message,
                 "createdAt": e.created_at, "target": e.target.describe(), "idempotencyKey": e.idempotency_key}
                for e in entries]  # fmt: skip
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    out = Console()
    if not out.is_terminal:  # plain tab-separated lines for scripts: a table would be cut to the width
        for e in entries:
            print("\t".join([e.task_id, e.tool, e.status, e.status_message or "", e.created_at, e.target.describe()]))
        return EXIT_OK
    table = Table("task id", "tool", "status", "message", "created", "server", box=None)
    for e in entries:
        table.add_row(e.task_id, e.tool, e.status, e.status_message or "", e.created_at, e.target.describe())
    out.print(table)
    return EXIT_OK
