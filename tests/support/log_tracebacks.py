"""The tracebacks the services' logs gained during a failed test, for its report.

A server answers an unexpected exception with "internal error (the server log has the details)";
the log sits in pytest's temporary directory, which CI does not keep. The report carries it instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["tracebacks_since"]

_HEADER = "Traceback (most recent call last):"
_PER_FILE = 3
_MAX_LINES = 60


def tracebacks_since(root: Path, since: float) -> str:
    """The last tracebacks (with the log line before each) of every `*.log` under `root` written since `since`."""
    parts = []
    for log in sorted(root.rglob("*.log")):
        try:
            if log.stat().st_mtime < since:
                continue
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue  # a log that went away with its directory
        blocks = list(_blocks(lines))[-_PER_FILE:]
        if blocks:
            parts.append(f"--- {log}\n" + "\n".join("\n".join(block) for block in blocks))
    return "\n".join(parts)


def _blocks(lines: list[str]) -> Iterator[list[str]]:
    for at, line in enumerate(lines):
        if line.strip() != _HEADER:
            continue
        block = lines[max(at - 1, 0) : at + 1]
        for following in lines[at + 1 : at + _MAX_LINES]:
            block.append(following)
            if following and not following[0].isspace():
                break  # the exception's own line ends the traceback
        yield block
