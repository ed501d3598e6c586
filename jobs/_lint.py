"""ruff on the reviewed Python files, its diagnostics as findings.

ruff runs in the repository root, so the repository's own configuration (`pyproject.toml`,
`ruff.toml`) decides the rules, as it would for its developers; without one, ruff's defaults
apply. It gets the files the review admitted, by name, in batches, and is polled: a cancel
kills it within POLL_S.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs._binaries import installed_binary
from jobs._findings import Finding, Severity
from jobs._logfiles import LogFile

__all__ = ["LintResult", "is_python", "lint"]

PYTHON_SUFFIXES = (".py", ".pyi")
BATCH = 200  # files per ruff process: command lines stay short
POLL_S = 0.05
TIMEOUT_S = 300
# What stops a program from running or importing; every other diagnostic is a warning.
ERRORS = ("E9", "F821", "F822", "F823", "F811", "F632", "F70")


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: int = 0  # Python files checked
    error: str | None = None  # why ruff could not check them, if it could not


def is_python(name: str) -> bool:
    return name.endswith(PYTHON_SUFFIXES)


def lint(root: Path, files: list[LogFile], *, tick: Callable[[], None] | None = None) -> LintResult:
    """ruff's diagnostics for the Python files among `files` (names relative to `root`).

    `tick()` runs every POLL_S while ruff runs; if it raises (a cancel), ruff is killed and the
    exception propagates. Without ruff installed, `error` says so.
    """
    names = [f.name for f in files if is_python(f.name)]
    result = LintResult(files=len(names))
    if not names:
        return result
    try:
        ruff = installed_binary("ruff", "ruff")
    except RuntimeError as exc:  # the review goes on without lint, and says why
        result.error = str(exc)
        return result
    for at in range(0, len(names), BATCH):
        raw, error = _run(ruff, root, names[at : at + BATCH], tick or (lambda: None))
        if error is not None:
            result.error = error
            break
        result.findings += [_finding(root, item) for item in raw]
    return result


def _run(ruff: str, root: Path, names: list[str], tick: Callable[[], None]) -> tuple[list[Any], str | None]:
    args = [ruff, "check", "--output-format", "json", "--no-cache", "--exit-zero", "--quiet", "--", *names]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, cwd=root, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while proc.poll() is None:
                tick()
                if time.monotonic() > deadline:
                    return [], f"ruff did not finish within {TIMEOUT_S} s"
                time.sleep(POLL_S)
        finally:
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:  # --exit-zero: only a configuration or usage error gets here
            message = err.read().decode(errors="replace").strip().splitlines()
            return [], f"ruff failed: {message[0] if message else f'exit status {proc.returncode}'}"
        try:
            return list(json.loads(out.read() or b"[]")), None
        except ValueError as exc:
            return [], f"ruff's output is not JSON: {exc}"


def _finding(root: Path, item: dict[str, Any]) -> Finding:
    code = item.get("code") or "invalid-syntax"
    severity: Severity = "error" if code == "invalid-syntax" or code.startswith(ERRORS) else "warning"
    fix = item.get("fix") or {}
    filename = Path(str(item.get("filename", "")))
    name = filename.relative_to(root).as_posix() if filename.is_relative_to(root) else filename.as_posix()
    return Finding(
        file=name,
        line=(item.get("location") or {}).get("row"),
        rule=code,
        severity=severity,
        message=str(item.get("message", "")),
        suggestion=fix.get("message") or None,
        source="lint",
    )
