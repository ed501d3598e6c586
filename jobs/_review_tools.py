"""The review sub-agent's tools, run on the worker when the model asks: search, read, duplicates, lint, house_rules.

Each tool's arguments are a pydantic model, which gives both the `inputSchema` the model sees
and the check of what it sends; a bad call comes back to the model as a tool error it can
correct, never as a failed job. Every path goes through the same confinement as the review
itself (`jobs._repofiles`), and every output is cut at MAX_OUTPUT_CHARS so that one tool call
cannot fill the model's context. The tools run on the job's thread; `tick()` (a cancel
checkpoint) runs inside each long one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobs._duplicates import MIN_LINES, Duplicate, find_duplicates
from jobs._findings import Finding, Severity
from jobs._lint import lint
from jobs._logfiles import LogFile, LogSearchError
from jobs._logfilters import LineFilter
from jobs._logsearch import Query, search_files
from jobs._repofiles import Listing, ReviewError, list_sources, read_lines, read_text
from jobs._rules import HouseRules

__all__ = ["SUBMIT", "ReviewSubmission", "ToolOutput", "Toolbox", "describe_duplicate", "load_texts"]

SUBMIT = "submit_review"
MAX_OUTPUT_CHARS = 12_000
MAX_LINE_CHARS = 300


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchArgs(_Args):
    pattern: str = Field(description="text to find, case-sensitive (a regular expression if regex is true)")
    regex: bool = Field(default=False, description="pattern is a regular expression (Rust regex syntax)")
    path: str | None = Field(default=None, description="file or directory to search; default: the reviewed path")
    glob: str = Field(default="*", description="only files whose path matches, e.g. '*.py' (* also matches /)")
    max_matches: int = Field(default=50, ge=1, le=200)


class ReadArgs(_Args):
    file: str = Field(description="path relative to the repository root")
    start: int = Field(default=1, ge=1, description="first line, 1-based")
    end: int | None = Field(default=None, ge=1, description="last line (inclusive); at most 400 lines are returned")


class PathArgs(_Args):
    path: str | None = Field(default=None, description="file or directory; default: the reviewed path")


class DuplicatesArgs(PathArgs):
    min_lines: int = Field(default=MIN_LINES, ge=3, le=100, description="shortest block to report")


class NoArgs(_Args):
    pass


_SEVERITY_WORDS = dict.fromkeys(("critical", "high", "major", "blocker", "severe"), "error") | dict.fromkeys(
    ("low", "note", "nit", "suggestion", "hint", "style"), "info"
)


class ModelFinding(BaseModel):
    file: str = Field(description="path relative to the repository root")
    line: int | None = Field(default=None, description="1-based line")
    rule: str = Field(default="review", description="the house rule or practice broken, in a few words")
    severity: Severity = "warning"
    message: str
    suggestion: str | None = Field(default=None, description="what to do instead")

    @field_validator("severity", mode="before")
    @classmethod
    def _usual_words(cls, value: Any) -> Any:
        """Models say "high" or "minor" as often as the schema's words: map those instead of refusing the review."""
        word = str(value).lower()
        return word if word in ("error", "warning", "info") else _SEVERITY_WORDS.get(word, "warning")

    @field_validator("line", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        return None if isinstance(value, int | float) and value < 1 else value


class ReviewSubmission(BaseModel):
    summary: str = Field(description="the review in a few sentences: what is good, what must change first")
    findings: list[ModelFinding] = Field(default_factory=list, description="one per problem, most severe first")


_TOOLS: dict[str, tuple[str, type[BaseModel]]] = {
    "search": ("Search the repository's files with ripgrep; returns matching lines as file:line: text.", SearchArgs),
    "read": ("Read lines of one file, numbered.", ReadArgs),
    "duplicates": ("Blocks of six or more lines that repeat (exactly, or the same shape with other names).",
                   DuplicatesArgs),
    "lint": ("Run ruff on the Python files of a path; returns its diagnostics.", PathArgs),
    "house_rules": ("The repository's house rules (STYLE.md, CONTRIBUTING.md or .review.md), in full.", NoArgs),
    SUBMIT: ("Submit the final review. Call it once, when you are done; it ends the review.", ReviewSubmission),
}  # fmt: skip


@dataclass(frozen=True)
class ToolOutput:
    text: str
    is_error: bool = False


def load_texts(
    root: Path, files: list[LogFile], tick: Callable[[], None], skipped: list[str] | None = None
) -> dict[str, str]:
    """The files' text by name; one that cannot be read now (removed since it was listed) goes to `skipped`."""
    texts = {}
    for file in files:
        tick()
        try:
            texts[file.name] = read_text(root, file)
        except OSError as exc:
            if skipped is not None:
                skipped.append(f"{file.name}: cannot be read ({exc.strerror or exc})")
    return texts


def describe_duplicate(duplicate: Duplicate) -> str:
    places = ", ".join(f"{o.file}:{o.start_line}-{o.end_line}" for o in duplicate.occurrences)
    return f"{duplicate.lines} lines ({duplicate.kind}) at {places}"


class Toolbox:
    """The tools for one review of `listing.path` under `root`."""

    def __init__(self, root: Path, listing: Listing, rules: HouseRules, tick: Callable[[], None]) -> None:
        self.root, self.listing, self.rules, self.tick = root, listing, rules, tick
        self._listings: dict[str, Listing] = {listing.path: listing}

    @staticmethod
    def definitions() -> list[dict[str, Any]]:
        """The tools as MCP `Tool`s (JSON), for the sampling request's `tools`."""
        return [
            {"name": name, "description": text, "inputSchema": model.model_json_schema()}
            for name, (text, model) in _TOOLS.items()
        ]

    def describe(self, name: str, arguments: dict[str, Any]) -> str:
        """What the tool call does, for the statusMessage: `reading src/app.py lines 1-80`."""
        where = arguments.get("path") or self.listing.path or "the repository"
        if name == "read":
            start, end = arguments.get("start") or 1, arguments.get("end")
            lines = f" lines {start}-{end}" if end else (f" from line {start}" if start != 1 else "")
            return f"reading {arguments.get('file')}{lines}"
        if name == "search":
            return f"searching {where} for {str(arguments.get('pattern'))[:60]!r}"
        plain = {"duplicates": f"looking for duplicates in {where}", "lint": f"linting {where}",
                 "house_rules": "reading the house rules", SUBMIT: "writing the review"}  # fmt: skip
        return plain.get(name, f"running {name}")

    def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """Run one tool call; a bad call or a refused path is a tool error for the model to read."""
        entry = _TOOLS.get(name)
        if entry is None or name == SUBMIT:
            return ToolOutput(f"no tool {name!r}; the tools are {sorted(_TOOLS)}", is_error=True)
        try:
            args = entry[1].model_validate(arguments)
            text = getattr(self, f"_{name}")(args)
        except ValidationError as exc:
            errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return ToolOutput(f"{name}: bad arguments: {errors}", is_error=True)
        except (ReviewError, LogSearchError) as exc:
            return ToolOutput(f"{name}: {exc}", is_error=True)
        except (OSError, RuntimeError) as exc:  # a file gone since it was listed, rg failing on it
            return ToolOutput(f"{name} failed: {exc}", is_error=True)
        if len(text) > MAX_OUTPUT_CHARS:
            text = text[:MAX_OUTPUT_CHARS] + f"\n[... cut at {MAX_OUTPUT_CHARS} characters: narrow the call]"
        return ToolOutput(text)

    def _files(self, path: str | None) -> Listing:
        key = self.listing.path if path is None else path
        if key not in self._listings:
            self._listings[key] = list_sources(self.root, key)
        return self._listings[key]

    def _search(self, args: SearchArgs) -> str:
        listing = self._files(args.path)
        files = [f for f in listing.files if fnmatch.fnmatchcase(f.name, args.glob)]
        if not files:
            return f"no file at {listing.path or '.'!r} matches the glob {args.glob!r}"
        query = Query(args.pattern, args.regex, LineFilter(), args.max_matches)
        found = search_files(self.root, files, query, tick=lambda progress: self.tick())
        lines = [f"{m.file}:{m.line_number}: {m.line[:MAX_LINE_CHARS]}" for m in found.matches]
        head = f"{found.total_matches} matching lines in {len(files)} files searched"
        shown = f" (the first {len(lines)})" if len(lines) < found.total_matches else ""
        return "\n".join([head + shown + ":", *lines]) if lines else head

    def _read(self, args: ReadArgs) -> str:
        text, first, last, total = read_lines(self.root, args.file, args.start, args.end)
        return f"{args.file} lines {first}-{last} of {total}:\n{text}"

    def _duplicates(self, args: DuplicatesArgs) -> str:
        listing = self._files(args.path)
        found = find_duplicates(load_texts(self.root, listing.files, self.tick), args.min_lines, tick=self.tick)
        if not found:
            return f"no block of {args.min_lines} or more lines repeats in {len(listing.files)} files"
        return "\n".join(
            f"- {describe_duplicate(d)}:\n    {d.preview.replace(chr(10), chr(10) + '    ')}" for d in found
        )

    def _lint(self, args: PathArgs) -> str:
        result = lint(self.root, self._files(args.path).files, tick=self.tick)
        if result.error:
            return f"ruff could not check the files: {result.error}"
        if not result.files:
            return "no Python file there"
        if not result.findings:
            return f"ruff finds nothing in {result.files} Python files"
        return "\n".join(_lint_line(f) for f in result.findings)

    def _house_rules(self, args: NoArgs) -> str:
        return self.rules.text or "This repository has no STYLE.md, CONTRIBUTING.md or .review.md."


def _lint_line(finding: Finding) -> str:
    fix = f" (fix: {finding.suggestion})" if finding.suggestion else ""
    return f"{finding.file}:{finding.line}: {finding.rule} {finding.message}{fix}"
