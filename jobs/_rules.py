"""The house rules: `.review.md`, `STYLE.md` or `CONTRIBUTING.md` in the reviewed directory or above it.

Their prose goes to the model as it is. The checks a program can make without a model are read
from fenced blocks marked `review-rules`, written in TOML, in any of these files:

    ```review-rules
    max_line_length = 120        # characters per line
    max_file_lines = 500         # lines per file
    max_function_lines = 50      # lines per Python function, its docstring included

    [[forbid]]                   # a regular expression no line may match
    pattern = 'except Exception\\b'
    files = "*.py"               # a glob on the path from the repository root; * also matches /
    rule = "no-broad-except"
    message = "catch the exceptions you expect"
    suggestion = "name the exception types"
    severity = "warning"         # error, warning (the default) or info
    ```

A nearer file's block overrides a farther one's numbers; `forbid` rules add up. A block that
does not parse is reported as a finding on its file instead of being silently ignored.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobs._findings import Finding, Severity
from jobs._logfiles import LogFile
from jobs._repofiles import read_text

__all__ = ["RULE_FILES", "Checks", "HouseRules", "check_file", "load_rules"]

RULE_FILES = (".review.md", "STYLE.md", "CONTRIBUTING.md")
MAX_RULES_CHARS = 32_000  # of prose for the model, all files together
MAX_PER_RULE_AND_FILE = 20  # then one finding says how many more
_BLOCK = re.compile(r"^```review-rules[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


class Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str
    files: str = "*"
    rule: str = ""
    message: str = ""
    suggestion: str | None = None
    severity: Severity = "warning"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        re.compile(value)  # re.error is a ValueError: pydantic reports it with the key
        return value


class Checks(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_line_length: int | None = Field(default=None, gt=0)
    max_file_lines: int | None = Field(default=None, gt=0)
    max_function_lines: int | None = Field(default=None, gt=0)
    forbid: list[Forbid] = Field(default_factory=list)


@dataclass
class HouseRules:
    """The rule files found (nearest first), their prose for the model, and the checks they declare."""

    files: list[str] = field(default_factory=list)
    text: str = ""
    checks: Checks = field(default_factory=Checks)
    problems: list[Finding] = field(default_factory=list)


def load_rules(root: Path, start: Path) -> HouseRules:
    """The house rules for a review of `start` (a resolved file or directory inside the root).

    Rule files are looked for in `start`'s directory and each one above it, up to the root.
    """
    rules = HouseRules()
    found = [(name, read_text(root, LogFile(name, path, 0, False))) for name, path in _rule_files(root, start)]
    merged: dict[str, Any] = {}
    forbid: list[Forbid] = []
    for name, text in reversed(found):  # the farthest first, so nearer numbers win
        for block in _BLOCK.finditer(text):
            try:
                checks = Checks.model_validate(tomllib.loads(block.group(1)))
            except (tomllib.TOMLDecodeError, ValidationError) as exc:
                line = text.count("\n", 0, block.start()) + 1
                rules.problems.append(_problem(name, line, exc))
                continue
            merged.update(checks.model_dump(exclude={"forbid"}, exclude_none=True))
            forbid.extend(checks.forbid)
    rules.checks = Checks(**merged, forbid=forbid)
    rules.files = [name for name, _ in found]
    rules.text = _prose(found)
    return rules


def _rule_files(root: Path, start: Path) -> Iterator[tuple[str, Path]]:
    directory = start if start.is_dir() else start.parent
    while directory.is_relative_to(root):
        for name in RULE_FILES:
            real = (directory / name).resolve()
            if real.is_file() and real.is_relative_to(root):  # a symlink may point elsewhere inside the root
                yield (directory / name).relative_to(root).as_posix(), real
        if directory == root:
            break
        directory = directory.parent


def _prose(found: list[tuple[str, str]]) -> str:
    text = "\n\n".join(f"--- {name} ---\n{body.strip()}" for name, body in found)
    if len(text) > MAX_RULES_CHARS:
        text = text[:MAX_RULES_CHARS] + f"\n[... cut at {MAX_RULES_CHARS} characters: read the files for the rest]"
    return text


def _problem(name: str, line: int, exc: Exception) -> Finding:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        detail = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
    else:
        detail = str(exc)
    return Finding(
        file=name,
        line=line,
        rule="review-rules",
        severity="warning",
        source="rules",
        message=f"this review-rules block cannot be used: {detail}",
        suggestion="fix the block (TOML: max_line_length, max_file_lines, max_function_lines, [[forbid]])",
    )


def check_file(checks: Checks, name: str, text: str) -> list[Finding]:
    """What the declared checks find in one file (`name` relative to the root)."""
    lines = text.splitlines()
    findings: list[Finding] = []
    if checks.max_file_lines is not None and len(lines) > checks.max_file_lines:
        findings.append(
            _finding(
                name,
                None,
                "max-file-lines",
                f"{len(lines)} lines, the limit is {checks.max_file_lines}",
                "split the module by responsibility",
            )
        )
    if checks.max_line_length is not None:
        limit = checks.max_line_length
        long_lines = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > limit]
        findings += _capped(
            name,
            "max-line-length",
            [
                _finding(name, n, "max-line-length", f"{length} characters, the limit is {limit}", "wrap the line")
                for n, length in long_lines
            ],
        )
    if checks.max_function_lines is not None and name.endswith(".py"):
        findings += _capped(name, "max-function-lines", _long_functions(name, text, checks.max_function_lines))
    for rule in checks.forbid:
        if fnmatch.fnmatchcase(name, rule.files):
            findings += _capped(name, rule.rule or f"forbid {rule.pattern}", _forbidden(name, lines, rule))
    return findings


def _long_functions(name: str, text: str, limit: int) -> list[Finding]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []  # ruff reports the syntax error
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append(
                    _finding(
                        name,
                        node.lineno,
                        "max-function-lines",
                        f"function {node.name} has {length} lines, the limit is {limit}",
                        "split it into smaller functions",
                    )
                )
    return found


def _forbidden(name: str, lines: list[str], rule: Forbid) -> list[Finding]:
    pattern = re.compile(rule.pattern)
    message = rule.message or f"matches the forbidden pattern {rule.pattern!r}"
    return [
        Finding(
            file=name,
            line=n,
            rule=rule.rule or f"forbid {rule.pattern}",
            severity=rule.severity,
            message=message,
            suggestion=rule.suggestion,
            source="rules",
        )
        for n, line in enumerate(lines, 1)
        if pattern.search(line)
    ]


def _capped(name: str, rule: str, findings: list[Finding]) -> list[Finding]:
    if len(findings) <= MAX_PER_RULE_AND_FILE:
        return findings
    more = len(findings) - MAX_PER_RULE_AND_FILE
    extra = _finding(name, None, rule, f"and {more} more like these in this file", None)
    return [*findings[:MAX_PER_RULE_AND_FILE], extra.model_copy(update={"severity": findings[0].severity})]


def _finding(name: str, line: int | None, rule: str, message: str, suggestion: str | None) -> Finding:
    return Finding(
        file=name, line=line, rule=rule, severity="warning", message=message, suggestion=suggestion, source="rules"
    )
