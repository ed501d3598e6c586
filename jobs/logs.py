"""The `log_search` tool: grep the team's log files from an assistant, as a Celery job.

The worker reads the logs under `JOBS_LOG_ROOT`; the search itself lives in `jobs._logsearch`
(ripgrep processes side by side, no Celery), this module only turns arguments into a query,
progress into `statusMessage`, and bad arguments into JSON-RPC -32602 errors. Once more lines
match than `max_matches`, every match is written to a JSON Lines artifact (`matches.jsonl`, linked
from the result; `matches_in_artifact` says how many it holds). A sharded search (below) returns
the inline part only.

How many rg processes one search runs at once: `JOBS_LOG_SEARCH_PROCESSES` if set, else the CPUs
the worker may use divided by its concurrency (at least one), so that a worker running one
search per pool process at once never starts more rg processes than there are CPUs:
`celery -A jobs worker -c 4` on 16 CPUs runs 4 per search, 16 in all.

A search over more than `JOBS_LOG_SHARD_BYTES` of files (1 GB by default) is sharded across the
workers: the files, in order, are cut into shards of about that size (a file is never cut), each
searched by a workflow member (`log_search_shard`, an ordinary Celery task) on whatever worker
takes it, and a merge step (`log_search_merge`) adds the counts up and keeps the first matches in
file order: the same result as one process searching them all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from celery import chord, group, signals
from pydantic import BaseModel, Field

import mcp_celery
from jobs import app
from jobs._logfiles import LogFile, LogSearchError, admit, expand, log_root
from jobs._logfilters import LineFilter
from jobs._logsearch import Progress, Query, SearchResult, available_cpus, search_files, validated
from jobs._logstream import MatchStream
from mcp_celery.errors import ArtifactError

__all__ = [
    "PROCESSES_ENV",
    "SHARD_BYTES_ENV",
    "MATCHES_ARTIFACT",
    "LogMatch",
    "LogSearchResult",
    "log_search",
    "log_search_merge",
    "log_search_shard",
    "search_processes",
    "shards_of",
]

STATUS_EVERY_S = 0.5  # statusMessage at most twice a second; cancel is checked every tick (20 ms)
MAX_MATCHES_LIMIT = 10_000
#: The artifact that holds every match once the inline cap is reached (JSON Lines).
MATCHES_ARTIFACT = "matches.jsonl"
#: rg processes one search runs at once (default: the CPUs the worker may use / its concurrency).
PROCESSES_ENV = "JOBS_LOG_SEARCH_PROCESSES"
#: Above this many bytes of files a search is sharded across the workers (and shards are about this big).
SHARD_BYTES_ENV = "JOBS_LOG_SHARD_BYTES"
DEFAULT_SHARD_BYTES = 1_000_000_000

#: The concurrency of the worker this process belongs to, noted in its main process at start
#: (pool processes are forked from it, so they see it too); None outside a worker.
_worker_concurrency: int | None = None


@signals.worker_init.connect(weak=False)
def _note_worker_concurrency(sender: Any = None, **_: Any) -> None:
    global _worker_concurrency
    concurrency = getattr(sender, "concurrency", None)
    if isinstance(concurrency, int) and concurrency > 0:
        _worker_concurrency = concurrency
    elif concurrency is not None:  # "auto", resolved after this signal: one pool process per CPU
        _worker_concurrency = available_cpus()


def search_processes() -> int:
    """rg processes one search may run at once: JOBS_LOG_SEARCH_PROCESSES, else CPUs / concurrency.

    Raises:
        ValueError: JOBS_LOG_SEARCH_PROCESSES is not a whole number of at least 1.
    """
    configured = os.environ.get(PROCESSES_ENV, "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(f"{PROCESSES_ENV} must be a whole number of at least 1, not {configured!r}")
        return int(configured)
    return max(1, available_cpus() // (_worker_concurrency or 1))


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
    rg_processes: int = Field(description=f"rg processes the search could run at once ({PROCESSES_ENV})")
    shards: int = Field(default=1, description=f"searches it was split into, across the workers ({SHARD_BYTES_ENV})")
    matches_in_artifact: int | None = Field(
        default=None,
        description=f"when total_matches is over max_matches: the matching lines in the {MATCHES_ARTIFACT} "
        "artifact (one JSON object per line: file, line_number, line), linked after this result",
    )
    artifact_error: str | None = Field(
        default=None, description=f"why the {MATCHES_ARTIFACT} artifact could not be kept (e.g. the store's quota)"
    )


def shards_so_far(members: Sequence[mcp_celery.MemberStatus]) -> str:
    """A sharded search's statusMessage: `2/4 shards done, 12,345 matches so far; log_search_shard-3: file 2/5, ...`."""
    done = [m for m in members if m.status == "completed" and isinstance(m.result, dict)]
    running = [m for m in members if m.status == "working" and m.status_message not in (None, "queued")]
    matches = sum(int(m.result["total_matches"]) for m in done)
    words = f"{len(done)}/{len(members)} shards done, {matches:,} matches so far"
    return f"{words}; {running[-1].label}: {running[-1].status_message}" if running else words


@mcp_celery.tool(app, workflow_summary=shards_so_far)
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
    started = time.time()
    criteria = {"pattern": pattern, "regex": regex, "since": since, "until": until, "level": level}
    try:
        query = _query(criteria, max_matches)
        root = log_root()
        files, skipped = expand(root, paths)
        shards = shards_of(files, shard_bytes())
        if len(shards) > 1:
            validated(root, query)  # a bad pattern is the caller's error, found before any shard is sent
    except LogSearchError as exc:
        raise mcp_celery.ProtocolError(-32602, str(exc)) from None
    if len(shards) > 1:
        members = group(log_search_shard.s([f.name for f in shard], criteria, max_matches) for shard in shards)
        ctx.run_workflow(chord(members, log_search_merge.s(max_matches, skipped, started)))
    try:
        # Past the cap every match goes to the artifact, whose pass counts them all: this one stops there.
        tick, workers = _Reporter(ctx), search_processes()
        result = search_files(root, files, query, skipped=skipped, tick=tick, workers=workers, stop_over_cap=True)
        extra: dict[str, Any] = {}
        if result.total_matches > len(result.matches):  # the cap was reached: every match goes in the artifact
            every, error = _all_matches(ctx, root, files, query)
            extra = {"total_matches": every.lines, "bytes_scanned": every.progress().bytes_done}
            if error is None:
                extra["matches_in_artifact"] = every.lines
            else:
                extra["artifact_error"] = error
    except LogSearchError as exc:
        raise mcp_celery.ProtocolError(-32602, str(exc)) from None
    return _result(result, time.time() - started).model_copy(update=extra)


def _all_matches(
    ctx: mcp_celery.JobContext, root: Path, files: list[LogFile], query: Query
) -> tuple[MatchStream, str | None]:
    """Search again, streaming every match into `matches.jsonl` (an artifact); the search (its `lines`
    count every match) and, when the store refused the artifact, why.

    A second pass, run only once the first found more matches than the inline cap (it stops there:
    this pass counts them all, and its count is `total_matches`). It holds no match: rg's output goes
    to the store as it comes (`jobs._logstream`); when the store refuses it (e.g. over the task's quota
    in Redis), the search goes on to count the rest.
    """
    ctx.status(f"writing every match to {MATCHES_ARTIFACT}")
    tick = _Reporter(ctx, prefix=f"writing {MATCHES_ARTIFACT}: ")
    every = MatchStream(root, files, query, tick=tick, workers=search_processes())
    chunks = iter(every)
    try:
        ctx.artifact(MATCHES_ARTIFACT, data=chunks, mime_type="application/jsonl")
    except ArtifactError as exc:  # the inline part stands, and the count goes on without the store
        for _ in chunks:
            pass
        return every, str(exc)
    return every, None


def _query(criteria: dict[str, Any], max_matches: int) -> Query:
    line_filter = LineFilter.build(criteria["since"], criteria["until"], criteria["level"])
    return Query(criteria["pattern"], criteria["regex"], line_filter, max_matches)


def _result(result: SearchResult, seconds: float, shards: int = 1) -> LogSearchResult:
    return LogSearchResult(
        matches=[LogMatch(file=m.file, line_number=m.line_number, line=m.line) for m in result.matches],
        total_matches=result.total_matches,
        files=result.files,
        bytes_scanned=result.bytes_scanned,
        seconds=round(seconds, 3),
        skipped=result.skipped,
        rg_processes=result.processes,
        shards=shards,
    )


def shard_bytes() -> int:
    """JOBS_LOG_SHARD_BYTES, else 1 GB.

    Raises:
        ValueError: it is set, and not a whole number of at least 1.
    """
    configured = os.environ.get(SHARD_BYTES_ENV, "").strip()
    if not configured:
        return DEFAULT_SHARD_BYTES
    if not configured.isdigit() or int(configured) < 1:
        raise ValueError(f"{SHARD_BYTES_ENV} must be a whole number of bytes, at least 1, not {configured!r}")
    return int(configured)


def shards_of(files: list[LogFile], limit: int) -> list[list[LogFile]]:
    """The files, in order, cut into runs of about `limit` bytes (a file is never cut); one run when they fit."""
    if sum(f.size for f in files) <= limit:
        return [files]
    shards: list[list[LogFile]] = [[]]
    size = 0
    for log in files:
        if shards[-1] and size + log.size > limit:
            shards.append([])
            size = 0
        shards[-1].append(log)
        size += log.size
    return shards


@app.task
def log_search_shard(names: list[str], criteria: dict[str, Any], max_matches: int) -> dict[str, Any]:
    """One shard of a sharded search (a workflow member): the files it names, admitted again here."""
    ctx = mcp_celery.current_context()
    assert ctx is not None
    root = log_root()
    files, skipped = admit(root, names)
    result = search_files(
        root, files, _query(criteria, max_matches), skipped=skipped, tick=_Reporter(ctx), workers=search_processes()
    )
    return _result(result, result.seconds).model_dump()


@app.task
def log_search_merge(
    shards: list[dict[str, Any]], max_matches: int, skipped: list[str], started: float
) -> dict[str, Any]:
    """A sharded search's merge step: counts added up, the first matches in file order (shards are in file order)."""
    results = [LogSearchResult.model_validate(shard) for shard in shards]
    return LogSearchResult(
        matches=[match for result in results for match in result.matches][:max_matches],
        total_matches=sum(r.total_matches for r in results),
        files=sum(r.files for r in results),
        bytes_scanned=sum(r.bytes_scanned for r in results),
        seconds=round(time.time() - started, 3),
        skipped=[*skipped, *(name for r in results for name in r.skipped)],
        rg_processes=max(r.rg_processes for r in results),
        shards=len(results),
    ).model_dump()


class _Reporter:
    """The search's tick: a cancel checkpoint every call, a statusMessage every STATUS_EVERY_S."""

    def __init__(self, ctx: mcp_celery.JobContext, prefix: str = "") -> None:
        self._ctx = ctx
        self._prefix = prefix
        self._last = float("-inf")

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._last < STATUS_EVERY_S:
            self._ctx.check_cancelled()
            return
        self._last = now
        self._ctx.status(self._prefix + describe(progress))  # a cancel checkpoint too


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
