"""A review finding: one place in one file, what rule it breaks, how bad, and what to do instead.

Every source of the review (the duplicate finder, ruff, the house-rule checks and the model)
reports in this one shape, which is also the tool's output schema.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["SEVERITIES", "Finding", "Severity", "Source", "sort_findings"]

Severity = Literal["error", "warning", "info"]
Source = Literal["duplicates", "lint", "rules", "model"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


class Finding(BaseModel):
    file: str = Field(description="path relative to the repository root")
    line: int | None = Field(default=None, description="1-based line, when the finding has one")
    rule: str = Field(description="what is broken: a ruff code, a house rule, 'duplicate-code', or the model's name")
    severity: Severity
    message: str
    suggestion: str | None = Field(default=None, description="what to do instead, when known")
    source: Source = Field(description="who found it: duplicates, lint (ruff), rules (house rules) or model")


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """By file, then line (findings without a line first), then severity."""
    return sorted(findings, key=lambda f: (f.file, f.line or 0, SEVERITIES.index(f.severity), f.rule))
