"""The code blocks of the README and the docs, and how each one is checked (`tests/docs/test_docs.py` runs them).

A fenced block's info string says how it is checked; a Python, shell, console or JSON block without
one of these fails the suite, so no snippet goes unchecked:

    python file=NAME   written into its page's scenario directory as NAME (and compiled); a later
                       block with the same NAME on that page continues the file
    python run         run with `python -` in its page's scenario; it must exit 0
    python check       compiled; every `mcp_celery` module and name it imports or uses must exist
    python excerpt=PATH  a quote of the repository file PATH (which its own tests run): each of its
                       code lines, comments aside, is a line of PATH, in order; a `...` line skips any
    sh run             each command run in its page's scenario, in order (services in the background)
    sh check           each command checked, not run: `mcp-celery ...` by the real argparse parser,
                       `celery -A MODULE` for a module of the repository or the page, `pip install`
                       extras against pyproject.toml, `python -m MODULE` for an importable module,
                       `NAME=value` for a known variable, repository paths for existence
    console run        the `$ ` lines run as in `sh run`; every other line must appear, in order, in
                       what they printed (`...` in a line matches anything)
    console check      the `$ ` lines checked as in `sh check`; the output shown is not checked
    json check         parsed; each `mcpServers` entry's command line checked as in `sh check`
    toml check         parsed; one with a `tools` table as an approval policy (its mistakes named as
                       `mcp-celery serve` names them: `mcp_celery.server.engine.policy`)
    json run           also each stdio `mcpServers` entry started in its page's scenario as a host
                       starts it (its Redis URLs the scenario's), `initialize` and `tools/list`
                       answered with tools

A `python run`, `sh run` or `console run` block may add `exit=N`: then its last command (the script,
for Python) must exit with status N instead of 0, as a page shows a command that fails
(`console run exit=2`: the command, and the one line it prints).

Over the whole text of every page: each MCP_CELERY_* or JOBS_* variable it names must be a `Settings`
field or be read somewhere in the code, each `mcp-celery ...` in backticks must parse, each
repository path in backticks must exist, and each message it quotes ("the worker ...", five words
or more) must be a whole string the code writes.

How a page's `file=` and `run` blocks run: `tests/support/snippet_scenario.py`; what the code is known to hold (its
settings, the variables it reads, the strings it writes, modules, extras, paths): `tests/support/snippet_code.py`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import json
import re
import shlex
import tokenize
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mcp_celery.cli import command as cli
from mcp_celery.errors import ConfigurationError
from mcp_celery.server.engine.policy import parse_policy
from tests.support.harness import ROOT
from tests.support.snippet_code import extras, message_in_code, module_exists, path_exists, repo_path, variable_known

__all__ = [
    "Block",
    "SnippetError",
    "blocks",
    "check_block",
    "check_prose",
    "command_lines",
    "known_files",
    "option",
    "pages",
    "quoted_messages",
    "split_commands",
]

CODE_LANGUAGES = {"python", "py", "sh", "bash", "shell", "console", "json", "toml"}
MODES = {"run", "check"}
#: Pages whose code blocks and prose are checked: everything the docs site publishes.
PAGE_GLOBS = ("README.md", "docs/**/*.md", "bench/*.md")
#: Pages a benchmark run writes (bench/report.py and friends): measurements as they were taken, whose
#: prose is not checked here (their code blocks would be).
GENERATED_REPORTS = ("bench/results",)
#: Commands a `sh check` block may use beyond those checked one by one; their path arguments are checked.
PLAIN_COMMANDS = {"kill", "echo", "curl", "cd", "ls", "redis-server", "redis-cli", "rabbitmq-server", "ruff", "mypy",
                  "npm", "bash", "mkdocs", "export", "git", "cat", "ollama", "."}  # fmt: skip
VARIABLE = re.compile(r"\b(?:MCP_CELERY|JOBS)_[A-Z0-9_]*[A-Z0-9]\b(?![*_])")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language and mode, and its text (dedented)."""

    page: str
    line: int
    language: str
    mode: str | None
    options: Mapping[str, str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def is_code(self) -> bool:
        return self.language in CODE_LANGUAGES


def pages() -> list[str]:
    found = {str(p.relative_to(ROOT)) for pattern in PAGE_GLOBS for p in ROOT.glob(pattern)}
    return sorted(found)


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a Markdown page, with the line each starts on."""
    found: list[Block] = []
    lines = (ROOT / page).read_text().splitlines()
    index = 0
    while index < len(lines):
        opened = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", lines[index])
        if not opened:
            index += 1
            continue
        indent, fence, info = opened.group(1), opened.group(2), opened.group(3).strip()
        body: list[str] = []
        index += 1
        while index < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[index]):
            body.append(lines[index][len(indent) :] if lines[index].startswith(indent) else lines[index].lstrip())
            index += 1
        start = index - len(body)
        language, mode, options = _info(info)
        found.append(Block(page, start, language, mode, options, "\n".join(body) + "\n"))
        index += 1
    return found


def _info(info: str) -> tuple[str, str | None, dict[str, str]]:
    words = info.split()
    language = words[0].lower() if words else ""
    mode: str | None = None
    options: dict[str, str] = {}
    for word in words[1:]:
        if "=" in word:
            key, _, value = word.partition("=")
            options[key] = value.strip("\"'")
            if key in {"file", "excerpt"}:
                mode = key
        elif word in MODES:
            mode = word
    return language, mode, options


# ---------------------------------------------------------------- checks


class SnippetError(AssertionError):
    pass


def check_prose(page: str) -> list[str]:
    """Problems in the page's whole text: unknown variables, `mcp-celery` spans that do not parse, missing paths."""
    if page.startswith(GENERATED_REPORTS):
        return []
    text = (ROOT / page).read_text()
    problems = [f"{page}: {name} is neither a Settings field nor read by the code"
                for name in sorted(set(VARIABLE.findall(text))) if not variable_known(name)]  # fmt: skip
    problems += [f"{page}: the code writes no message {quote!r}" for quote in quoted_messages(text)
                 if not message_in_code(quote)]  # fmt: skip
    files = known_files(page)
    for span in INLINE_CODE.findall(text):
        span = span.strip()
        if span.startswith("mcp-celery ") and not _names_a_command(span):
            problems += [f"{page}: `{span}`: {p}" for p in _command_problems(span, files)]
        elif repo_path(span) and not path_exists(span):
            problems.append(f"{page}: `{span}` does not exist in the repository")
    return problems


def quoted_messages(text: str) -> list[str]:
    """Text the prose quotes as a message: in double quotes, starting with "the ", five words or more."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks have their own checks
    quotes = (" ".join(q.split()) for q in re.findall(r'"(the [^"`]+)"', prose))
    return [q for q in quotes if len(q.split()) >= 5]


def _names_a_command(span: str) -> bool:
    """Whether `span` only names a command (`mcp-celery tasks wait`), rather than giving a command line."""
    words = span.split()[1:]
    parser, _ = cli.parser_for(words)
    for word in words:
        choices = [a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not choices or word not in choices[0]:
            return False
        parser = choices[0][word]
    return True


def check_block(block: Block, page_files: frozenset[str] = frozenset()) -> None:
    """Check one block as its mode says (`run` blocks are compiled or parsed here, and run by a Scenario).

    Raises:
        SnippetError: the block has no mode, or it does not hold.
    """
    if block.mode is None:
        raise SnippetError(
            f"{block.where}: a {block.language} block must say how it is checked (run, check, file=, excerpt=)"
        )
    problems = _option_problems(block)
    if block.mode == "excerpt":
        problems += _excerpt_problems(block.text, block.options["excerpt"])
    elif block.language in {"python", "py"}:
        problems += _python_problems(block.text)
    elif block.language in {"sh", "bash", "shell"}:
        problems += [p for line in command_lines(block.text) for p in _command_problems(line, page_files)]
    elif block.language == "console":
        commands = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
        problems += [p for line in commands for p in _command_problems(line, page_files)]
    elif block.language == "toml":
        problems += _toml_problems(block)
    else:
        problems += _json_problems(block.text, page_files)
    if problems:
        raise SnippetError(f"{block.where}:\n  " + "\n  ".join(problems))


def _option_problems(block: Block) -> list[str]:
    """`exit=N` is for a Python, shell or console block that runs, and N is a status."""
    if "exit" not in block.options:
        return []
    if block.mode != "run" or block.language == "json":
        return [f"exit={block.options['exit']}: only a python, sh or console block that runs has an exit status"]
    if not block.options["exit"].isdigit() or int(block.options["exit"]) > 255:
        return [f"exit={block.options['exit']}: not an exit status (0 to 255)"]
    return []


def _toml_problems(block: Block) -> list[str]:
    """A TOML block is only checked: parsed, and one with a `tools` table as an approval policy."""
    if block.mode != "check":
        return [f"a toml block is checked, not run: `toml check`, not `toml {block.mode}`"]
    try:
        if "tools" in tomllib.loads(block.text):
            parse_policy(block.text, block.where)
    except (tomllib.TOMLDecodeError, ConfigurationError) as exc:
        return [str(exc)]
    return []


def command_lines(script: str) -> list[str]:
    """The command lines of a shell snippet: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line for line in (raw.strip() for raw in joined.splitlines()) if line and not line.startswith("#")]


def split_commands(line: str) -> list[list[str]]:
    """`a && b ; c | d` as argument lists; `# comments` dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _command_problems(line: str, page_files: frozenset[str] = frozenset()) -> list[str]:
    try:
        commands = split_commands(line)
    except ValueError as exc:
        return [f"{line!r} is not a shell command line: {exc}"]
    problems: list[str] = []
    for argv in commands:
        problems += [f"{line!r}: {p}" for p in _argv_problems(argv, page_files)]
    return problems


def _argv_problems(argv: list[str], page_files: frozenset[str]) -> list[str]:
    problems: list[str] = []
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # NAME=value before the command
        problems += _variable_problems(argv.pop(0).split("=", 1)[0])
    if not argv:
        return problems
    command, args = argv[0], argv[1:]
    if "/" in command and Path(command).name in {"pip", "python", "python3", "mcp-celery"}:
        command = Path(command).name  # a virtualenv's own pip, python or mcp-celery
    if command == "export":
        return problems + [p for a in args for p in _variable_problems(a.split("=", 1)[0])]
    if command == "mcp-celery":
        return problems + _mcp_celery_problems(args, page_files)
    if command == "celery":
        app = option(args, "-A", "--app")
        if app is None or not module_exists(app.split(":")[0], page_files):
            problems.append(f"celery -A {app}: no such module")
        return problems
    if command == "pip":
        return problems + _pip_problems(args)
    if command in {"python", "python3"}:
        return problems + _python_command_problems(args, page_files)
    if command == "docker":
        return problems + ([] if (ROOT / "docker-compose.yml").exists() else ["no docker-compose.yml"])
    if command not in PLAIN_COMMANDS:
        return [*problems, f"the checker does not know the command {command!r}"]
    return problems + _path_problems(args)


def _variable_problems(name: str) -> list[str]:
    if VARIABLE.fullmatch(name) and not variable_known(name):
        return [f"{name} is neither a Settings field nor read by the code"]
    return []


def option(args: list[str], *names: str) -> str | None:
    """The value of option NAME in `args`, given as `NAME VALUE` or `NAME=VALUE`."""
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def _mcp_celery_problems(args: list[str], page_files: frozenset[str]) -> list[str]:
    parser, parsed_args = cli.parser_for(args)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = parser.parse_args(parsed_args)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return []
        return [f"mcp-celery {' '.join(args)}: {err.getvalue().strip().splitlines()[-1]}"]
    app = getattr(namespace, "app", None)
    module = None if app is None else app.split(":")[0]
    if module is not None and module.endswith(".py"):  # the module's file: the page's, by its name
        module = Path(module).stem
    if module is not None and not module_exists(module, page_files):
        return [f"mcp-celery -A {app}: no such module"]
    return []


def _pip_problems(args: list[str]) -> list[str]:
    problems = []
    for arg in args:
        requested = re.fullmatch(r"(.*)\[([\w,-]+)\]", arg)
        if requested and requested.group(1).rstrip("/").endswith(("mcp-celery", ".")):
            missing = set(requested.group(2).split(",")) - extras()
            problems += [f"pip install {arg}: pyproject.toml has no extra {m!r}" for m in sorted(missing)]
    return problems


def _python_command_problems(args: list[str], page_files: frozenset[str]) -> list[str]:
    module = option(args, "-m")
    problems = []
    if module is not None and not module_exists(module, page_files):
        problems.append(f"python -m {module}: no such module")
    return problems + _path_problems(args)


def _path_problems(args: list[str]) -> list[str]:
    return [f"{arg} does not exist in the repository" for arg in args if repo_path(arg) and not path_exists(arg)]


def _excerpt_problems(text: str, source: str) -> list[str]:
    """The lines of an excerpt that are not, in order, lines of `source` (comments and indentation aside)."""
    path = ROOT / source
    if not path.is_file():
        return [f"quotes {source}, which is not a file of the repository"]
    wanted = [line for line in map(_code_of, text.splitlines()) if line]
    have = [line for line in map(_code_of, path.read_text().splitlines()) if line]
    at = 0
    for line in wanted:
        if line == "...":
            continue
        try:
            at = have.index(line, at) + 1
        except ValueError:
            return [f"quotes {source}, but {line!r} is not one of its lines (after the ones before it)"]
    return []


def _code_of(line: str) -> str:
    """A line's code: without a trailing `# comment` (outside strings) and surrounding space."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return line.strip()  # an unfinished bracket: the comment cannot be told apart, keep the line
    comments = [t for t in tokens if t.type == tokenize.COMMENT]
    return (line[: comments[0].start[1]] if comments else line).strip()


def _python_problems(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
        compile(tree, "<snippet>", "exec")
    except SyntaxError as exc:
        return [f"does not compile: {exc}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mcp_celery":
            problems += [p for alias in node.names for p in _name_problems(node.module, alias.name)]
        elif isinstance(node, ast.Import):
            problems += [p for a in node.names if a.name.startswith("mcp_celery") for p in _name_problems(a.name, None)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mcp_celery":
            problems += _name_problems("mcp_celery", node.attr)
    return problems


def _name_problems(module: str, name: str | None) -> list[str]:
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        return [f"import {module}: {exc}"]
    if name is not None and name != "*" and not hasattr(imported, name):
        return [f"{module} has no {name!r}"]
    return []


def _json_problems(text: str, page_files: frozenset[str]) -> list[str]:
    try:
        document = json.loads(text)
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    problems: list[str] = []
    for name, server in (document.get("mcpServers") or {}).items():
        if "command" not in server:  # a server reached over HTTP: its URL is the endpoint `serve --http` serves
            if not str(server.get("url", "")).endswith("/mcp"):
                problems.append(f"mcpServers.{name}: neither a command nor a URL ending in /mcp")
            continue
        argv = [server["command"], *server.get("args", [])]
        problems += [f"mcpServers.{name}: {p}" for p in _argv_problems(argv, page_files)]
        problems += [f"mcpServers.{name}: {p}" for var in server.get("env", {}) for p in _variable_problems(var)]
    return problems


def known_files(page: str) -> frozenset[str]:
    """The files a page's commands may name as modules: its own `file=` blocks, and the README's example."""
    return frozenset(b.options["file"] for p in {page, "README.md"} for b in blocks(p) if b.mode == "file")
