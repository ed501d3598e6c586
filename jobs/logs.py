"""The `log_search` tool: grep the team's log files from an assistant, as a Celery job.

The worker reads the logs under `JOBS_LOG_ROOT`; the search itself lives in `jobs._logsearch`
(ripgrep on both cores, no Celery), this module only turns arguments into a query, progress
into `statusMessage`, and bad arguments into JSON-RPC -32602 errors.
"""

from __future__ import annotations

import time
from typing import Annotated

from pydantic import BaseModel, Field

import mcp_celery
from jobs import app
from jobs._logfiles import LogSearchError, log_root
from jobs._logfilters import LineFilter
from jobs._logsearch import Progress, Query, search

__all__ = ["LogMatch", "LogSearchResult", "log_search"]

STATUS_EVERY_S = 0.5  # statusMessage at most twice a second; cancel is checked every tick (20 ms)
MAX_MATCHES_LIMIT = 10_000


class LogMatch(BaseModel):
    file: str = Field(description="path relative to the log root")
    line_number: int = Field(description="1-based line number in the file (in the inflated data for gzip)")
    line: str = Field(description="the matching line, cut after 2000 bytes")


class LogSearchResult(BaseModel):
    matches: list[LogMatch] = Field(description="the first max_matches matching lines, in file and line order")
    total_matches: int = Field(description="all matching lines (a line with several hits counts once)")
    files: int = Field(description="files searched")
    bytes_scanned: int = Field(description="bytes read from the files (compressed size for gzip)")
    seconds: float
    skipped: list[str] = Field(description="files the glob matched but that were not searched, and why")


@mcp_celery.tool(app)
def log_search(
    ctx: mcp_celery.JobContext,
    paths: Annotated[str, Field(description="glob relative to the log root, e.g. 'api/*.log' or '**/*.gz'")],
    pattern: Annotated[str, Field(description="text to find (a regular expression if regex is true)")],
    regex: Annotated[bool, Field(description="treat pattern as a regular expression (Rust regex syntax)")] = False,
    since: Annotated[str | None, Field(description="keep lines stamped at or after this ISO 8601 time")] = None,
    until: Annotated[str | None, Field(description="keep lines stamped at or before this ISO 8601 time")] = None,
    level: Annotated[str | None, Field(description="keep lines of this level, e.g. ERROR")] = None,
    max_matches: Annotated[int, Field(ge=0, le=MAX_MATCHES_LIMIT, description="matching lines to return")] = 1000,
) -> LogSearchResult:
    """Search log files (plain or gzip) for matching lines, like grep -c plus the first matches.

    Case-sensitive. since/until compare each line's leading timestamp (lines without one are left
    out when either is set; a time without a zone is UTC); level compares the first word after
    that timestamp or a level= field.
    """
    try:
        query = Query(pattern, regex, LineFilter.build(since, until, level), max_matches)
        result = search(log_root(), paths, query, tick=_Reporter(ctx))
    except LogSearchError as exc:
        raise mcp_celery.ProtocolError(-32602, str(exc)) from None
    return LogSearchResult(
        matches=[LogMatch(file=m.file, line_number=m.line_number, line=m.line) for m in result.matches],
        total_matches=result.total_matches,
        files=result.files,
        bytes_scanned=result.bytes_scanned,
        seconds=result.seconds,
        skipped=result.skipped,
    )


class _Reporter:
    """The search's tick: a cancel checkpoint every call, a statusMessage every STATUS_EVERY_S."""

    def __init__(self, ctx: mcp_celery.JobContext) -> None:
        self._ctx = ctx
        self._last = float("-inf")

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._last < STATUS_EVERY_S:
            self._ctx.check_cancelled()
            return
        self._last = now
        self._ctx.status(describe(progress))  # a cancel checkpoint too


def describe(progress: Progress) -> str:
    """`file 3/12, 41% of 1.2 GB, 1,284 matches`."""
    percent = 100 * progress.bytes_done // progress.bytes_total if progress.bytes_total else 100
    return (
        f"file {progress.file_number}/{progress.files}, {percent}% of {human_bytes(progress.bytes_total)}, "
        f"{progress.matches:,} matches"
    )


def human_bytes(count: int) -> str:
    """Decimal units, as `ls -h --si` counts: 512 B, 12 kB, 1.2 GB."""
    value, unit = float(count), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}" if unit != "B" and value < 10 else f"{value:.0f} {unit}"
