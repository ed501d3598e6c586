"""A review's findings as SARIF 2.1.0, the format code-scanning tools read (one run, one tool).

Each finding becomes a result: its rule (declared once in the driver's `rules`), its level
(`error`, `warning`, `note` for our info), its message (the suggestion appended), and its place
as a physical location relative to the repository root (`%SRCROOT%`), with a start line when
the finding has one. Which source found it (duplicates, lint, rules, model) is a result property.
"""

from __future__ import annotations

import json
from typing import Any

from jobs._findings import Finding

__all__ = ["SARIF_SCHEMA", "SARIF_VERSION", "sarif_log"]

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def sarif_log(findings: list[Finding], *, tool_version: str) -> str:
    """The SARIF log (JSON text) of `findings`."""
    rules = sorted({f.rule for f in findings})
    index = {rule: i for i, rule in enumerate(rules)}
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "mcp-celery code_review",
                "version": tool_version,
                "rules": [{"id": rule, "shortDescription": {"text": rule}} for rule in rules],
            }
        },
        "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "the repository root (JOBS_REPO_ROOT)"}}},
        "results": [_result(f, index[f.rule]) for f in findings],
    }
    return json.dumps({"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}, indent=1)


def _result(finding: Finding, rule_index: int) -> dict[str, Any]:
    text = finding.message + (f" Suggestion: {finding.suggestion}" if finding.suggestion else "")
    location: dict[str, Any] = {"artifactLocation": {"uri": finding.file, "uriBaseId": "%SRCROOT%"}}
    if finding.line is not None and finding.line >= 1:
        location["region"] = {"startLine": finding.line}
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": _LEVELS[finding.severity],
        "message": {"text": text or finding.rule},
        "locations": [{"physicalLocation": location}],
        "properties": {"source": finding.source},
    }
