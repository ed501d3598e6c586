"""The approval policy: which tools a named person must approve before their job is queued.

Server tier, engine floor; the file's format and matching only (the gate that acts on a rule is
`gate`). `MCP_CELERY_APPROVAL_POLICY=PATH` names a TOML file with one table per tool name or glob:

    [tools."deploy_*"]
    approvers = ["bob", "carol"]   # required: principals, as the tokens file and JWT subjects name them
    four_eyes = true               # the default: whoever called the tool may not approve it
    timeout_s = 3600               # optional; else MCP_CELERY_INPUT_TIMEOUT_S
    message = "Deploy {service} to {env}?"   # optional; the fields are the call's arguments

A table named exactly like the tool wins; else the first glob in the file that matches it
(`fnmatch`, case-sensitive). Every mistake is refused with the line it is on (a key that is not one
of these, close to one of them or not, a string where a list belongs, a message field the tool does
not take), at start and on every change: the file is read again when its modification time or size
changes, as the tokens file is (`mcp_celery.server.edge.auth`). While the file cannot be read, the
gate refuses every tool call (`gate`): a policy that guards nothing is never taken for one that guards.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import re
import string
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_celery.errors import ConfigurationError

__all__ = ["KEYS", "Policy", "PolicyFile", "Rule", "parse_policy"]

logger = logging.getLogger(__name__)

#: The keys a tool's table may hold.
KEYS = ("approvers", "four_eyes", "timeout_s", "message")
#: A principal's name, as the tokens file allows it (`mcp_celery.server.edge.tokens`).
_PRINCIPAL = re.compile(r"^[^\s#]{1,200}$")
#: A message field: an argument's name, nothing looked up on it (no `.attr`, no `[index]`).
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Rule:
    """One table of the policy: what a call of a matching tool needs before its job is queued."""

    #: The table's name: a tool's name or a glob.
    pattern: str
    approvers: tuple[str, ...]
    four_eyes: bool = True
    #: Seconds the approval may take (None: MCP_CELERY_INPUT_TIMEOUT_S).
    timeout_s: float | None = None
    #: What the approver reads; `{name}` is the call's argument `name` (None: "Run TOOL?").
    message: str | None = None

    def matches(self, tool: str) -> bool:
        return fnmatch.fnmatchcase(tool, self.pattern)

    def message_for(self, tool: str, shown: Mapping[str, str]) -> str:
        """The approval's message for a call whose arguments, as the page shows them, are `shown`."""
        if self.message is None:
            return f"Run {tool}?"
        return self.message.format_map(_Shown(shown))


class _Shown(dict[str, str]):
    """The arguments a message names; one the call lacks reads `?` rather than failing the call."""

    def __missing__(self, key: str) -> str:
        return "?"


@dataclass(frozen=True)
class Policy:
    """The rules of one version of the policy file, in file order."""

    rules: tuple[Rule, ...] = ()

    def rule_for(self, tool: str) -> Rule | None:
        """The rule for `tool`: the table named exactly like it, else the first glob that matches; None: no approval."""
        exact = next((rule for rule in self.rules if rule.pattern == tool), None)
        return exact or next((rule for rule in self.rules if rule.matches(tool)), None)


def parse_policy(text: str, source: str, tools: Mapping[str, Sequence[str]] | None = None) -> Policy:
    """The policy in `text` (read from `source`, which error messages name).

    `tools`: the served tools' parameter names by tool name; a message field that a tool its table
    matches does not take is refused.

    Raises:
        ConfigurationError: the text is not TOML, or not a policy; the message names the line.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"at line (\d+)", str(exc))
        raise _Problem(None, str(exc)).error(source, text, int(found.group(1)) if found else None) from None
    try:
        return Policy(tuple(_rules(data, tools or {})))
    except _Problem as problem:
        raise problem.error(source, text, _lines(text).line_of(problem.path)) from None


class _Problem(ConfigurationError):
    """What is wrong, and the TOML path (table and key) it is wrong at."""

    def __init__(self, path: tuple[str, ...] | None, what: str) -> None:
        super().__init__(what)
        self.path = path or ()
        self.what = what

    def error(self, source: str, text: str, line: int | None) -> ConfigurationError:
        if line is None:
            return ConfigurationError(f"approval policy {source}: {self.what}")
        quoted = text.splitlines()[line - 1].strip() if 0 < line <= len(text.splitlines()) else ""
        return ConfigurationError(f"approval policy {source} line {line} ({quoted}): {self.what}")


def _rules(data: Mapping[str, Any], tools: Mapping[str, Sequence[str]]) -> Iterator[Rule]:
    for key in data:
        if key != "tools":
            raise _Problem((key,), f'unknown top-level key {key!r}: the policy holds [tools."NAME-OR-GLOB"] tables')
    tables = data.get("tools", {})
    if not isinstance(tables, Mapping):
        raise _Problem(("tools",), 'tools must be tables: [tools."NAME-OR-GLOB"]')
    for pattern, table in tables.items():
        path = ("tools", pattern)
        if not isinstance(table, Mapping):
            raise _Problem(path, f'tools.{pattern!r} must be a table: [tools."{pattern}"] with approvers = [...]')
        rule = _rule(pattern, table, path)
        for tool, parameters in tools.items():
            if rule.matches(tool) and rule.message is not None:
                _check_fields(rule.message, tool, parameters, (*path, "message"))
        yield rule


def _rule(pattern: str, table: Mapping[str, Any], path: tuple[str, ...]) -> Rule:
    for key in table:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (the keys are {', '.join(KEYS)})"
            raise _Problem((*path, key), f"unknown key {key!r}{hint}")
    if "approvers" not in table:
        raise _Problem(path, 'approvers is required: approvers = ["bob", "carol"]')
    approvers = table["approvers"]
    if not isinstance(approvers, list) or not approvers or not all(_is_principal(a) for a in approvers):
        raise _Problem(
            (*path, "approvers"), 'approvers must be a non-empty list of principal names, e.g. approvers = ["bob"]'
        )
    four_eyes = table.get("four_eyes", True)
    if not isinstance(four_eyes, bool):
        raise _Problem((*path, "four_eyes"), "four_eyes must be true or false")
    timeout_s = table.get("timeout_s")
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0
    ):
        raise _Problem((*path, "timeout_s"), "timeout_s must be a number of seconds above 0")
    message = table.get("message")
    if message is not None:
        _check_message(message, (*path, "message"))
    return Rule(pattern, tuple(approvers), four_eyes, None if timeout_s is None else float(timeout_s), message)


def _is_principal(value: Any) -> bool:
    return isinstance(value, str) and bool(_PRINCIPAL.match(value))


def _check_message(message: Any, path: tuple[str, ...]) -> None:
    if not isinstance(message, str) or not message.strip():
        raise _Problem(path, "message must be a non-empty string")
    try:
        fields = [(field, spec, conversion) for _, field, spec, conversion in string.Formatter().parse(message)]
    except ValueError as exc:
        raise _Problem(path, f"message: {exc} (write {{{{ and }}}} for a brace)") from None
    for field, spec, conversion in fields:
        if field is not None and (not _FIELD.match(field) or spec or conversion):
            raise _Problem(path, f"message field {{{field}}} must be an argument's plain name, as in {{service}}")


def _check_fields(message: str, tool: str, parameters: Sequence[str], path: tuple[str, ...]) -> None:
    for _, field, _, _ in string.Formatter().parse(message):
        if field is not None and field not in parameters:
            takes = ", ".join(parameters) or "no arguments"
            raise _Problem(path, f"message field {{{field}}} is not an argument of tool {tool!r} (it takes {takes})")


@dataclass(frozen=True)
class _Lines:
    """Where each table and key of a TOML text is defined (1-based), for error messages."""

    where: dict[tuple[str, ...], int]

    def line_of(self, path: tuple[str, ...]) -> int | None:
        """The line of `path`, else of the nearest table above it that is written out."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.where:
                return self.where[path[:end]]
        return None


def _lines(text: str) -> _Lines:
    where: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        found: tuple[str, ...] | None = None
        if line.startswith("["):
            found = table = _path_of(line) or table
        else:
            for at in (i for i, char in enumerate(line) if char == "="):
                if (key := _path_of(line[:at] + "= 0")) is not None:  # the key alone, whatever its value
                    found = table + key
                    break
        for end in range(1, len(found or ()) + 1):  # a dotted name defines the tables above it too
            where.setdefault((found or ())[:end], number)
    return _Lines(where)


def _path_of(fragment: str) -> tuple[str, ...] | None:
    """The one path a header (`[a."b"]`) or a key (`a.b = 0`) names, as TOML reads it; None if it is neither."""
    try:
        node: Any = tomllib.loads(fragment)
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        ((key, node),) = node.items()
        path.append(key)
    return tuple(path) if path else None


class PolicyFile:
    """The policy file, read again whenever its modification time or size changes.

    Raises (constructor):
        ConfigurationError: the file cannot be read, or is not a policy (the line is named).
    """

    def __init__(self, path: Path, tools: Mapping[str, Sequence[str]]) -> None:
        self.path = path
        self.tools = tools
        self._stamp: tuple[int, int, int] | None = None
        self._policy = self._read(self._stat())
        #: What is wrong with the file now, and the version it is wrong in (None: it cannot be read).
        self._error: ConfigurationError | None = None
        self._error_stamp: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int]:
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the approval policy MCP_CELERY_APPROVAL_POLICY={self.path}: {exc.strerror}"
            ) from exc
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _read(self, stamp: tuple[int, int, int]) -> Policy:
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read the approval policy {self.path}: {exc}") from exc
        policy = parse_policy(text, str(self.path), self.tools)
        self._stamp = stamp
        return policy

    def current(self) -> Policy:
        """The policy as the file says now.

        Raises:
            ConfigurationError: the file cannot be read now, or its latest version is not a policy
                (logged once per version, with its line).
        """
        stamp = None
        try:
            stamp = self._stat()
            if stamp != self._stamp:
                if self._error is not None and self._error_stamp == stamp:
                    raise self._error  # this version was read already: not again on every call
                self._policy = self._read(stamp)
                logger.warning("approval policy %s read again: %d rule(s)", self.path, len(self._policy.rules))
        except ConfigurationError as exc:
            self._failed(stamp, exc)
            raise
        self._error = None
        return self._policy

    def _failed(self, stamp: tuple[int, int, int] | None, error: ConfigurationError) -> None:
        if self._error is None or str(self._error) != str(error):
            logger.error("%s; every tool call is refused until it is fixed", error)
        self._error, self._error_stamp = error, stamp

    def unmatched(self) -> list[str]:
        """The tables that match none of the served tools (a misspelled name, most likely)."""
        return [rule.pattern for rule in self._policy.rules if not any(rule.matches(tool) for tool in self.tools)]
