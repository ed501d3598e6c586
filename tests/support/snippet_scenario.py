"""Running a page's `file=` and `run` blocks, as `tests/docs/test_docs.py` does (the modes: tests/support/snippets.py).

A page's scenario: its `file=` blocks are written to a fresh directory (with the README's, such as
`proj.py`, that the page does not write itself: other pages name them too), then its `run` blocks
run there in order, with CELERY_BROKER_URL and CELERY_RESULT_BACKEND on database 15 of the suite's
Redis (emptied first), the client journal in that directory, `mcp-celery` and `celery` run as
`python -m mcp_celery` and `python -m celery` (this checkout's code; a virtualenv's `mcp-celery` by
its path too), port 8000 replaced by a free one, /path/to/your/project by the directory, and a path
under /etc/ taken under the directory (`/etc/mcp-celery/tokens` is
`DIR/etc/mcp-celery/tokens`). A `celery ... worker` line and a `mcp-celery serve ... --http` line
are services: started in the background, waited for until they answer, and stopped by pid when the
page's scenario ends. Every other command must exit 0, but the last one of a block with `exit=N`
must exit N.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mcp_celery.testing.jsonrpc import RawStdioClient
from mcp_celery.testing.processes import Process
from tests.support.harness import ROOT, free_port, http_answers
from tests.support.snippets import Block, SnippetError, blocks, command_lines, option, split_commands

__all__ = ["Scenario", "console_steps", "exit_status", "unmatched"]

#: The port the docs use, replaced by a free one when a page runs.
DOCS_PORT = "8000"
#: A path the docs use for configuration, taken under the scenario's directory when a page runs.
SYSTEM_CONFIG = re.compile(r"(?<![\w./~-])/etc/")
#: The reader's project directory in the docs (host configs name it), the scenario's directory when a page runs.
PROJECT_DIR = "/path/to/your/project"
#: Variables a page's scenario sets for every command, whatever a snippet says: its Redis and journal.
SCENARIO_OWNED = ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "MCP_CELERY_REDIS_URL", "MCP_CELERY_CLIENT_JOURNAL")


@dataclass
class Scenario:
    """One page's `file=` and `run` blocks, run in a directory of its own against the suite's Redis."""

    directory: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    services: list[Process] = field(default_factory=list)

    @classmethod
    def for_page(cls, page: str, directory: Path, base_env: Mapping[str, str], redis_url: str) -> Scenario:
        env = {**base_env, "CELERY_BROKER_URL": redis_url, "CELERY_RESULT_BACKEND": redis_url}
        env["MCP_CELERY_CLIENT_JOURNAL"] = str(directory / "journal.db")
        env["PYTHONPATH"] = os.pathsep.join([str(directory), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        scenario = cls(directory, env)
        own = {block.options["file"] for block in blocks(page) if block.mode == "file"}
        for block in blocks("README.md") if page != "README.md" else []:
            if block.mode == "file" and block.options["file"] not in own:
                scenario.write(block)
        return scenario

    def local(self, text: str) -> str:
        """The snippet as run here: port 8000 is this scenario's free port, /etc/ a folder of its directory."""
        text = SYSTEM_CONFIG.sub(f"{self.directory}/etc/", text).replace(PROJECT_DIR, str(self.directory))
        return re.sub(rf"(?<=[:= ]){DOCS_PORT}\b", str(self.port), text)

    def write(self, block: Block) -> None:
        """Write a `file=` block; a later block naming the same file continues it, as a reader adds to it."""
        path = self.directory / block.options["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        before = path.read_text() + "\n\n" if path.exists() else ""
        path.write_text(before + self.local(block.text))

    def run_python(self, block: Block) -> None:
        done = subprocess.run([sys.executable, "-"], input=self.local(block.text), cwd=self.directory, env=self.env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != exit_status(block):
            raise SnippetError(f"{block.where}: exit {done.returncode}, not {exit_status(block)}\n"
                               f"{done.stdout}{done.stderr}{self.logs()}")  # fmt: skip

    def run_shell(self, block: Block) -> None:
        lines = command_lines(block.text)
        for index, line in enumerate(lines):
            self.run_line(block, line, exit_status(block) if index == len(lines) - 1 else 0)

    def run_console(self, block: Block) -> None:
        steps = list(console_steps(block.text))
        for index, (command, expected) in enumerate(steps):
            output = self.run_line(block, command, exit_status(block) if index == len(steps) - 1 else 0)
            missing = unmatched(expected, output.splitlines())
            if missing is not None:
                raise SnippetError(f"{block.where}: `{command}` did not print {missing!r}; it printed:\n{output}")

    def run_host_config(self, block: Block) -> None:
        """Start each stdio server of an `mcpServers` config as a host would, and list its tools.

        The config's own Redis URLs are the reader's; the scenario's take their place, and its
        PYTHONPATH comes first.
        """
        for name, server in json.loads(self.local(block.text)).get("mcpServers", {}).items():
            if "command" not in server:
                continue
            env = {**self.env, **server.get("env", {})}
            env.update({key: self.env[key] for key in SCENARIO_OWNED if key in self.env})
            env["PYTHONPATH"] = os.pathsep.join([self.env["PYTHONPATH"], server.get("env", {}).get("PYTHONPATH", "")])
            argv = self._command([server["command"], *server.get("args", [])])
            log = self.directory / f"host-{name}.log"
            client = RawStdioClient(argv, env, log, cwd=self.directory)
            try:
                tools = host_session_tools(client)
            except AssertionError as exc:  # the server exited before it answered: its log says why
                raise SnippetError(f"{block.where}: mcpServers.{name}: {exc}\n{log.read_text()}") from exc
            finally:
                client.close()
            if not tools:
                raise SnippetError(f"{block.where}: mcpServers.{name} listed no tools\n{log.read_text()}")

    def run_line(self, block: Block, line: str, status: int = 0) -> str:
        """Run one command line (a service in the background); returns what it printed.

        Its last command must exit with `status`, the ones before it with 0.
        """
        output = []
        commands = split_commands(self.local(line))
        for index, argv in enumerate(commands):
            expected = status if index == len(commands) - 1 else 0
            env = dict(self.env)
            while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
                name, _, value = argv.pop(0).partition("=")
                env[name] = value
            if argv[0] == "export":
                self.env.update(a.split("=", 1) for a in argv[1:])  # type: ignore[arg-type]
                continue
            command = self._command(argv)
            if self._service(argv):
                if expected != 0:
                    raise SnippetError(f"{block.where}: `{line}` starts a service, which is not expected to exit")
                self._start(block, command, env, argv)
                continue
            # One stream, as a terminal shows it (the suite's environment has PYTHONUNBUFFERED=1).
            done = subprocess.run(command, cwd=self.directory, env=env, stdout=subprocess.PIPE, text=True,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
            if done.returncode != expected:
                raise SnippetError(
                    f"{block.where}: `{line}` exited {done.returncode}, not {expected}\n{done.stdout}{self.logs()}"
                )
            output.append(done.stdout)
        return "".join(output)

    @staticmethod
    def _command(argv: list[str]) -> list[str]:
        if Path(argv[0]).name == "mcp-celery":  # also a virtualenv's, by its path
            return [sys.executable, "-m", "mcp_celery", *argv[1:]]
        if argv[0] == "celery":
            return [sys.executable, "-m", "celery", *argv[1:]]
        if argv[0] in {"python", "python3"}:
            return [sys.executable, *argv[1:]]
        return argv

    @staticmethod
    def _service(argv: list[str]) -> bool:
        if argv[0] == "celery":
            return "worker" in argv
        return argv[0] == "mcp-celery" and {"serve", "--http"} <= set(argv)

    def _start(self, block: Block, command: list[str], env: Mapping[str, str], argv: list[str]) -> None:
        log = self.directory / f"service-{len(self.services)}.log"
        proc = Process(command, env, log, cwd=self.directory)
        self.services.append(proc)
        if argv[0] == "celery":
            proc.wait_ready(lambda: "ready." in proc.output(), 60, f"{block.where}: the worker")
        else:
            port = option(argv, "--port") or DOCS_PORT
            proc.wait_ready(lambda: http_answers(f"http://127.0.0.1:{port}/mcp"), 60, f"{block.where}: the server")

    def logs(self) -> str:
        return "".join(f"\n--- {p.log.name} ({' '.join(p.args[1:4])}):\n{p.tail(20)}" for p in self.services)

    def stop(self) -> None:
        for proc in reversed(self.services):
            proc.stop()


def exit_status(block: Block) -> int:
    """The status the last command of a `run` block must exit with: its `exit=N`, else 0."""
    return int(block.options.get("exit", 0))


def host_session_tools(client: RawStdioClient) -> list[str]:
    """The tool names a host without the tasks extension sees: `initialize`, then `tools/list`."""
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "docs-host", "version": "1"}}
    client.request("initialize", hello, modern=False)
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    listed = client.request("tools/list", {}, modern=False)
    return [tool["name"] for tool in listed.get("result", {}).get("tools", [])]


def console_steps(text: str) -> Iterator[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each `$ ` line of a console block."""
    command: str | None = None
    expected: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, expected
            command, expected = line[2:], []
        elif command is not None and line.strip() and line.strip() != "...":
            expected.append(line)
    if command is not None:
        yield command, expected


def unmatched(expected: list[str], actual: list[str]) -> str | None:
    """The first expected line not found, in order, among `actual` (`...` matches anything); None if all are."""
    position = 0
    for wanted in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in wanted.strip().split("...")))
        while position < len(actual) and not pattern.fullmatch(actual[position].strip()):
            position += 1
        if position == len(actual):
            return wanted
        position += 1
    return None
