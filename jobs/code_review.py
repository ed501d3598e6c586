"""The `code_review` tool: a sub-agent that reviews code in the repository, thinking with the client's model.

The main agent hands off a review and gets a task: the job first runs what a program can check
(duplicate blocks, ruff, the checks the house rules declare), then an agent loop whose model is
the client's, reached through sampling (`jobs._review_agent`): each turn is a
`sampling/createMessage` input request, so the task shows `input_required` while the client's
model thinks, and `working` with "turn 3/8: reading src/app.py lines 1-80" while the worker runs
the tools it asked for. The worker needs no model of its own. A client that does not sample (or
declines) still gets the deterministic findings, with the reason the model review was skipped.

The worker reads the repository under `JOBS_REPO_ROOT` (confined as `log_search` is to its root);
`path` is relative to it. The findings are also attached as a SARIF 2.1.0 artifact
(`findings.sarif`, `jobs._sarif`). Needs the `jobs` extra (ripgrep and ruff).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp_types import CreateMessageResult, CreateMessageResultWithTools
from pydantic import BaseModel, Field

import mcp_celery
from jobs import app
from jobs._duplicates import Duplicate, find_duplicates
from jobs._findings import Finding, sort_findings
from jobs._lint import is_python, lint
from jobs._repofiles import Listing, ReviewError, list_sources, repo_root, resolve_path
from jobs._review_agent import AgentOutcome, ReviewAgent
from jobs._review_prompt import brief, system_prompt
from jobs._review_tools import Toolbox, load_texts
from jobs._rules import HouseRules, check_file, load_rules
from jobs._sarif import sarif_log
from mcp_celery.inputs import ToolChoiceMode

__all__ = ["SARIF_ARTIFACT", "CodeReviewResult", "DuplicateBlock", "code_review"]

#: The artifact that holds the findings as SARIF 2.1.0 (for code-scanning tools).
SARIF_ARTIFACT, SARIF_TYPE = "findings.sarif", "application/sarif+json"

MAX_TOKENS_PER_TURN = 4096
MAX_TURNS_LIMIT = 50
TURN_TIMEOUT_ENV = "JOBS_REVIEW_TURN_TIMEOUT_S"
DEFAULT_TURN_TIMEOUT_S = 600.0  # a local model on a laptop may take minutes per turn


class Place(BaseModel):
    file: str
    start_line: int
    end_line: int


class DuplicateBlock(BaseModel):
    lines: int = Field(description="significant lines in the block (blank lines, comments and imports left out)")
    kind: Literal["exact", "renamed"] = Field(description="exact: the same text; renamed: the same shape, other names")
    occurrences: list[Place]
    preview: str = Field(description="the block's first lines")


class TokenUsage(BaseModel):
    input: int
    output: int
    estimated: bool = Field(description="true when the client did not report the model's usage (4 chars a token)")


class CodeReviewResult(BaseModel):
    path: str = Field(description="what was reviewed, relative to the repository root ('' = all of it)")
    files_reviewed: int
    findings: list[Finding] = Field(description="everything found: duplicates, ruff, house rules, the model")
    duplicates: list[DuplicateBlock]
    summary: str = Field(description="the model's summary, or why the model review was skipped and what was found")
    model_review: Literal["completed", "max_turns", "skipped", "stopped"] = Field(
        description="completed: the model gave its review; max_turns: it ran out of turns; skipped: the client "
        "does not sample (or declined); stopped: the client stopped answering during the review"
    )
    model_review_note: str | None = Field(description="why the model review was skipped or stopped")
    model: str | None = Field(description="the model the client used, as it named it")
    dropped_findings: int = Field(description="findings the model gave for files that are not in the repository")
    turns: int = Field(description="sampling requests answered")
    tokens: TokenUsage
    house_rules: list[str] = Field(description="the house-rule files found, nearest first")
    lint_error: str | None = Field(description="why ruff could not check the Python files, if it could not")
    skipped: list[str] = Field(description="files under the path that were not reviewed, and why")
    seconds: float


@mcp_celery.tool(app)
def code_review(
    ctx: mcp_celery.JobContext,
    path: Annotated[str, Field(description="file or directory to review, relative to the repository root ('.' = all)")],
    focus: Annotated[str, Field(description="what to look at first, e.g. 'error handling in the HTTP layer'")] = "",
    max_turns: Annotated[int, Field(ge=1, le=MAX_TURNS_LIMIT, description="sampling turns the model gets")] = 8,
) -> CodeReviewResult:
    """Review code in the repository: duplicate blocks, ruff, the house rules, then a review by your model.

    The model is the client's, through sampling with tools (search, read, duplicates, lint,
    house_rules): each turn shows as input_required. Without sampling, the deterministic
    findings come back alone and the result says the model review was skipped.
    """
    started = time.monotonic()
    root = repo_root()
    try:
        listing = list_sources(root, path)
        start = resolve_path(root, path)[1]
    except ReviewError as exc:
        raise mcp_celery.ProtocolError(-32602, str(exc)) from None
    checked = _deterministic(ctx, root, listing, start)
    toolbox = Toolbox(root, listing, checked.rules, ctx.check_cancelled)
    outcome = _model_review(ctx, toolbox, listing, focus, max_turns, checked)
    findings = sort_findings(checked.findings + outcome.findings)
    ctx.status(f"review done: {len(findings)} findings")
    ctx.artifact(SARIF_ARTIFACT, sarif_log(findings, tool_version=mcp_celery.__version__), mime_type=SARIF_TYPE)
    return CodeReviewResult(
        path=listing.path,
        files_reviewed=len(listing.files),
        findings=findings,
        duplicates=[_block(d) for d in checked.duplicates],
        summary=outcome.summary or _plain_summary(outcome, checked, len(listing.files)),
        model_review=outcome.state,
        model_review_note=outcome.note,
        model=outcome.model,
        dropped_findings=outcome.dropped,
        turns=outcome.turns,
        tokens=TokenUsage(input=outcome.input_tokens, output=outcome.output_tokens, estimated=outcome.tokens_estimated),
        house_rules=checked.rules.files,
        lint_error=checked.lint_error,
        skipped=listing.skipped,
        seconds=round(time.monotonic() - started, 3),
    )


class _Checked:
    """What the programs found before the model is asked."""

    def __init__(self, texts: dict[str, str], duplicates: list[Duplicate], rules: HouseRules) -> None:
        self.texts, self.duplicates, self.rules = texts, duplicates, rules
        self.findings: list[Finding] = [_duplicate_finding(d) for d in duplicates]
        self.lint_error: str | None = None


def _deterministic(ctx: mcp_celery.JobContext, root: Path, listing: Listing, start: Path) -> _Checked:
    ctx.status(f"reading {len(listing.files)} files")
    texts = load_texts(root, listing.files, ctx.check_cancelled, listing.skipped)
    listing.files = [file for file in listing.files if file.name in texts]
    ctx.status(f"looking for duplicates in {len(texts)} files")
    duplicates = find_duplicates(texts, tick=ctx.check_cancelled)
    checked = _Checked(texts, duplicates, load_rules(root, start))
    ctx.status(f"linting {sum(is_python(name) for name in texts)} Python files")
    # Once per task: the model's questions may park the job, and its resume runs this again from the
    # top; the reads above take moments, ruff (a subprocess over the whole tree) is kept.
    linted = ctx.once("lint", lambda: _lint_as_json(root, listing, ctx))
    checked.lint_error = linted["error"]
    checked.findings += [Finding.model_validate(f) for f in linted["findings"]] + checked.rules.problems
    for name, text in texts.items():
        checked.findings += check_file(checked.rules.checks, name, text)
    return checked


def _lint_as_json(root: Path, listing: Listing, ctx: mcp_celery.JobContext) -> dict[str, Any]:
    linted = lint(root, listing.files, tick=ctx.check_cancelled)
    return {"findings": [f.model_dump(mode="json") for f in linted.findings], "error": linted.error}


def _model_review(
    ctx: mcp_celery.JobContext, toolbox: Toolbox, listing: Listing, focus: str, max_turns: int, checked: _Checked
) -> AgentOutcome:
    sampling = ctx.capabilities.get("sampling")
    if not isinstance(sampling, dict):
        return AgentOutcome(state="skipped", note="the client did not declare the sampling capability")
    use_tools = isinstance(sampling.get("tools"), dict)
    timeout = float(os.environ.get(TURN_TIMEOUT_ENV) or DEFAULT_TURN_TIMEOUT_S)

    def sample(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, choice: ToolChoiceMode | None, system: str
    ) -> CreateMessageResult | CreateMessageResultWithTools:
        if tools is None:
            return ctx.sample(messages, MAX_TOKENS_PER_TURN, timeout, systemPrompt=system)
        return ctx.sample(messages, MAX_TOKENS_PER_TURN, timeout, tools=tools, tool_choice=choice, systemPrompt=system)

    # Without tools the model cannot read anything: it gets the code in its first message, and one turn.
    agent = ReviewAgent(toolbox, sample, ctx.status, max_turns if use_tools else 1, _is_repo_file(toolbox))
    first = brief(
        listing,
        focus,
        findings=checked.findings,
        duplicates=checked.duplicates,
        rules=checked.rules,
        code=None if use_tools else checked.texts,
    )
    return agent.run(first, system_prompt(max_turns, use_tools=use_tools), use_tools=use_tools)


def _is_repo_file(toolbox: Toolbox) -> Callable[[str], bool]:
    def exists(name: str) -> bool:
        try:
            return resolve_path(toolbox.root, name)[1].is_file()
        except ReviewError:
            return False

    return exists


def _duplicate_finding(duplicate: Duplicate) -> Finding:
    first, *others = duplicate.occurrences
    places = ", ".join(f"{o.file}:{o.start_line}-{o.end_line}" for o in others)
    how = "the same" if duplicate.kind == "exact" else "the same shape, with other names,"
    return Finding(
        file=first.file,
        line=first.start_line,
        rule="duplicate-code",
        severity="warning",
        message=f"these {duplicate.lines} lines ({first.start_line}-{first.end_line}) repeat, {how} at {places}",
        suggestion="extract the block into one function and call it from each place"
        + ("" if duplicate.kind == "exact" else ", with parameters for what differs"),
        source="duplicates",
    )


def _block(duplicate: Duplicate) -> DuplicateBlock:
    return DuplicateBlock(
        lines=duplicate.lines,
        kind=duplicate.kind,
        occurrences=[Place(file=o.file, start_line=o.start_line, end_line=o.end_line) for o in duplicate.occurrences],
        preview=duplicate.preview,
    )


def _plain_summary(outcome: AgentOutcome, checked: _Checked, files: int) -> str:
    sources = [finding.source for finding in checked.findings]
    found = (
        f"{_count(len(checked.duplicates), 'duplicate block')}, {_count(sources.count('lint'), 'ruff finding')} and "
        f"{_count(sources.count('rules'), 'house-rule finding')} in {_count(files, 'file')}"
    )
    why = f"Model review {outcome.state}: {outcome.note}." if outcome.note else "The model gave no summary."
    return f"{why} Deterministic checks found {found}."


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"
