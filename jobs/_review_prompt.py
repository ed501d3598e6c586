"""What the review sub-agent is told: the system prompt, and the first message with what is known already.

The deterministic findings go in the first message, so the model builds on them instead of
spending turns finding what a program finds; so do the house rules (cut when long: the
`house_rules` tool has them whole) and the list of files. A client that samples without tools
gets the code itself instead, as much as fits CODE_BUDGET_CHARS, and one turn to answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobs._duplicates import Duplicate
from jobs._findings import Finding
from jobs._repofiles import Listing
from jobs._review_tools import SUBMIT, describe_duplicate
from jobs._rules import HouseRules

__all__ = ["CODE_BUDGET_CHARS", "brief", "system_prompt"]

CODE_BUDGET_CHARS = 48_000
RULES_IN_BRIEF_CHARS = 8_000
MAX_LISTED_FILES = 200
MAX_LISTED_FINDINGS = 60

_ROLE = """You are a code reviewer, working as a sub-agent for another agent that wrote or changed this code.
Review it for: code that repeats (the same block, or the same shape with other names), breaches of the
house rules, bugs and unhandled errors, unclear names, and missing tests. Be concrete: every finding names
a file and a line, says what is wrong and what to do instead. Do not repeat the deterministic findings you
are given; confirm, explain or add to them. Severity: error (a bug or a broken rule that must be fixed),
warning (should be fixed), info (a suggestion)."""

_WITH_TOOLS = f"""You have tools: search (ripgrep), read (a file's lines), duplicates, lint (ruff) and house_rules.
Read the code before you judge it. You have at most {{max_turns}} turns; one turn is one reply of yours, and
all the tool calls of one reply run together, so ask for several at once when you can. When you are done,
call {SUBMIT} once with your summary and findings; that ends the review."""

_WITHOUT_TOOLS = """Answer with your review as one JSON object in a ```json block:
{"summary": "...", "findings": [{"file": "...", "line": 1, "rule": "...", "severity": "warning",
"message": "...", "suggestion": "..."}]}"""


def system_prompt(max_turns: int, *, use_tools: bool) -> str:
    return f"{_ROLE}\n\n{_WITH_TOOLS.format(max_turns=max_turns) if use_tools else _WITHOUT_TOOLS}"


def brief(
    listing: Listing,
    focus: str,
    *,
    findings: list[Finding],
    duplicates: list[Duplicate],
    rules: HouseRules,
    code: Mapping[str, str] | None = None,
) -> str:
    """The first user message of the review of `listing.path`."""
    where = listing.path or "the whole repository"
    parts = [f"Review {where}." + (f" Focus: {focus.strip()}" if focus.strip() else "")]
    names = [f.name for f in listing.files]
    listed = "\n".join(names[:MAX_LISTED_FILES])
    more = f"\n... and {len(names) - MAX_LISTED_FILES} more" if len(names) > MAX_LISTED_FILES else ""
    parts.append(f"Files under review ({len(names)}):\n{listed}{more}")
    parts.append(_deterministic(findings, duplicates))
    if rules.text:
        text = rules.text
        if len(text) > RULES_IN_BRIEF_CHARS:
            text = text[:RULES_IN_BRIEF_CHARS] + "\n[... the rest: call house_rules]"
        parts.append(f"House rules ({', '.join(rules.files)}):\n{text}")
    else:
        parts.append("This repository has no house rules file (STYLE.md, CONTRIBUTING.md or .review.md).")
    if code is not None:
        parts.append(_code(code))
    return "\n\n".join(parts)


def _deterministic(findings: list[Finding], duplicates: list[Duplicate]) -> str:
    if not findings and not duplicates:
        return "Deterministic checks (duplicates, ruff, house-rule checks) found nothing."
    lines = [f"- {describe_duplicate(d)}" for d in duplicates[:20]]
    others = [f for f in findings if f.source != "duplicates"]
    lines += [
        f"- {f.file}:{f.line or '-'} [{f.source} {f.rule}, {f.severity}] {f.message}"
        for f in others[:MAX_LISTED_FINDINGS]
    ]
    if len(others) > MAX_LISTED_FINDINGS:
        lines.append(f"- ... and {len(others) - MAX_LISTED_FINDINGS} more")
    return "Deterministic findings so far:\n" + "\n".join(lines)


def _code(code: Mapping[str, str]) -> str:
    """The files' text, numbered, until CODE_BUDGET_CHARS; the files that did not fit are named."""
    shown: list[str] = []
    left_out: list[str] = []
    budget = CODE_BUDGET_CHARS
    for name, text in code.items():
        numbered = "\n".join(f"{n:5} {line}" for n, line in enumerate(text.splitlines(), 1))
        if len(numbered) > budget:
            left_out.append(name)
            continue
        shown.append(f"--- {name} ---\n{numbered}")
        budget -= len(numbered)
    tail = f"\n\n(Not shown, for length: {', '.join(left_out)})" if left_out else ""
    return "The code:\n\n" + "\n\n".join(shown) + tail
