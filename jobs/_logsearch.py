"""Log search over files under a root: plain Python and ripgrep, no Celery.

`search()` expands the glob inside the root, cuts big files into segments at line starts,
groups small files into batches of about `chunk_bytes`, and runs one rg process per batch on
a pool of `workers` threads (default: one per CPU this process may use; the `log_search` tool
passes fewer, so that the searches a worker runs side by side share the CPUs). Batches finish
in any order; results are merged in file order,
so `matches` are the first `max_matches` matching lines of the files in name order, with
their line numbers in their file. Memory stays constant whatever the input size: data flows
from the page cache into rg's pipe, and only the kept matches are held.

The caller's `tick(progress)` runs on the calling thread every TICK_S seconds: it is where the
Celery job reports progress and checks for cancel. If it raises (a cancel), every rg process is
killed at once and the exception propagates once the threads are back.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobs._logfiles import LogFile, expand, open_inside
from jobs._logfilters import LineFilter
from jobs._ripgrep import BatchResult, ProcessSet, Ripgrep, Segment

__all__ = ["Match", "Progress", "Query", "SearchResult", "available_cpus", "search", "search_files", "validated"]

CHUNK_BYTES = 64 << 20
FIRST_BYTES = 1 << 20  # the first batch of a search that stops over the cap (`search_files`)
TICK_S = 0.02  # a cancel is seen within this (one Redis GET per tick)
BOUNDARY_SCAN = 64 << 10


@dataclass(frozen=True)
class Query:
    pattern: str
    regex: bool = False
    line_filter: LineFilter = field(default_factory=LineFilter)
    max_matches: int = 1000


@dataclass(frozen=True)
class Match:
    file: str
    line_number: int
    line: str


@dataclass(frozen=True)
class Progress:
    file_number: int  # 1-based number of the latest file being read
    files: int
    bytes_done: int
    bytes_total: int
    matches: int


@dataclass
class SearchResult:
    matches: list[Match]
    total_matches: int
    files: int
    bytes_scanned: int
    seconds: float
    skipped: list[str]
    processes: int


def search(
    root: Path,
    paths: str,
    query: Query,
    *,
    tick: Callable[[Progress], None] | None = None,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> SearchResult:
    """Search the files under `root` matching the glob `paths` for `query`.

    Raises:
        LogSearchError: bad glob (or no file matches), bad pattern, or a pattern with a newline.
        RuntimeError: rg is missing or failed, or a file could not be read.
    """
    started = time.perf_counter()
    files, skipped = expand(root, paths)
    return search_files(
        root, files, query, skipped=skipped, tick=tick, workers=workers, chunk_bytes=chunk_bytes, started=started
    )


def search_files(
    root: Path,
    files: list[LogFile],
    query: Query,
    *,
    skipped: list[str] | None = None,
    tick: Callable[[Progress], None] | None = None,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    started: float | None = None,
    stop_over_cap: bool = False,
) -> SearchResult:
    """Search `files`, already admitted under `root` (by `expand` or another confined listing), for `query`.

    `stop_over_cap`: stop once the first `max_matches` are held and one more match is known (every rg
    killed): `total_matches` is then only more than `max_matches`, not the count (a caller that goes on
    to read every match, `jobs._logstream`, counts them there).

    Raises:
        LogSearchError: bad pattern, or a pattern with a newline.
        RuntimeError: rg is missing or failed, or a file could not be read.
    """
    started = time.perf_counter() if started is None else started
    rg = validated(root, query)
    # Stopping over the cap, a small first batch often holds more than the cap on its own: then the
    # search ends as soon as it does, not when a whole segment has been searched.
    batches = plan_batches(root, files, chunk_bytes, first_bytes=FIRST_BYTES if stop_over_cap else None)
    run = _Run(rg, batches, files, query, stop_over_cap)
    processes = max(1, workers or available_cpus())
    run.execute(processes, tick or (lambda progress: None))
    return SearchResult(
        matches=run.matches,
        total_matches=run.total,
        files=len(files),
        bytes_scanned=run.bytes_done,
        seconds=round(time.perf_counter() - started, 3),
        skipped=list(skipped or []),
        processes=processes,
    )


def validated(root: Path, query: Query) -> Ripgrep:
    """The rg runner of `query`, its pattern checked first when it is a regular expression.

    Raises:
        LogSearchError: a bad pattern, or a pattern with a newline.
    """
    rg = Ripgrep(root, query.pattern, regex=query.regex, line_filter=query.line_filter, keep=query.max_matches)
    if query.regex:
        rg.check()
    return rg


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan_batches(
    root: Path, files: list[LogFile], chunk_bytes: int, first_bytes: int | None = None
) -> list[list[Segment]]:
    """Segments in file order, grouped: a big file's chunks and each gzip file alone, small files together.
    With `first_bytes`, the first batch holds about that much (a first file bigger than it is cut there)."""
    batches: list[list[Segment]] = []
    current: list[Segment] = []
    current_bytes, limit = 0, first_bytes or chunk_bytes
    for index, log in enumerate(files):
        for segment in _segments(root, index, log, chunk_bytes, first_bytes if index == 0 else None):
            size = segment.end - segment.start
            if current and (log.gzip or current[-1].file.gzip or current_bytes + size > limit):
                batches.append(current)
                current, current_bytes, limit = [], 0, chunk_bytes
            current.append(segment)
            current_bytes += size
    if current:
        batches.append(current)
    return batches


def _segments(root: Path, index: int, log: LogFile, chunk_bytes: int, first_bytes: int | None) -> list[Segment]:
    first_cut = first_bytes is not None and first_bytes < log.size
    if log.gzip or (log.size <= chunk_bytes and not first_cut):
        return [Segment(index, log, 0, log.size)]
    cuts = [0]
    targets = [
        *([first_bytes] if first_bytes is not None and first_cut else []),
        *range(chunk_bytes, log.size, chunk_bytes),
    ]
    with open_inside(root, log.path) as handle:
        for target in targets:
            cut = _line_start_at_or_after(handle.fd, max(target, cuts[-1]), log.size)
            if cut < log.size and cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(log.size)
    return [Segment(index, log, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]


def _line_start_at_or_after(fd: int, offset: int, size: int) -> int:
    """The first offset >= `offset` that starts a line (or `size`), read in small blocks."""
    position = offset - 1  # a line starts at `offset` when the byte before it is a newline
    while position < size:
        block = os.pread(fd, BOUNDARY_SCAN, position)
        newline = block.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        if not block:
            break
        position += len(block)
    return size


class _Run:
    """One search's shared state: batches run on a pool, merged in order as they complete."""

    def __init__(
        self, rg: Ripgrep, batches: list[list[Segment]], files: list[LogFile], query: Query, stop_over_cap: bool
    ) -> None:
        self.rg, self.batches, self.files, self.query = rg, batches, files, query
        self.stop_over_cap = stop_over_cap
        self.procs = ProcessSet()
        self.lock = threading.Lock()
        self.matches: list[Match] = []
        self.total = 0
        self.bytes_done = 0
        self.file_number = 1 if files else 0
        self._results: dict[int, BatchResult] = {}
        self._running: dict[int, int] = {}  # matches seen so far by batches still running
        self._merged = 0  # batches merged, in order
        self._file_lines: dict[int, int] = {}  # lines seen so far per file index, over merged batches

    def execute(self, workers: int, tick: Callable[[Progress], None]) -> None:
        # One thread per rg process at once: each thread runs one batch's rg to its end.
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="logsearch")
        try:
            pending = {pool.submit(self._batch, index) for index in range(len(self.batches))}
            while pending:
                done, pending = concurrent.futures.wait(pending, TICK_S, concurrent.futures.FIRST_EXCEPTION)
                for future in done:
                    future.result()  # an rg or read failure ends the search
                tick(self.progress())
        finally:
            self.procs.stop()  # a no-op after a clean finish; kills rg at once on cancel or error
            pool.shutdown(wait=True, cancel_futures=True)

    def progress(self) -> Progress:
        total_bytes = sum(f.size for f in self.files)
        with self.lock:
            matches = self.total + sum(self._running.values())
        return Progress(self.file_number, len(self.files), self.bytes_done, total_bytes, matches)

    def _batch(self, index: int) -> None:
        if self.procs.stopped.is_set():
            return
        # Matches are needed only until the in-order prefix holds max_matches: that prefix only
        # grows and batches start in order, so once a batch only counts, all later ones do too.
        count_only = not self.query.line_filter.active and len(self.matches) >= self.query.max_matches
        result = self.rg.run(
            self.batches[index],
            count_only=count_only,
            procs=self.procs,
            progress=self._progress,
            found=lambda count: self._found(index, count),
        )
        with self.lock:
            self._running.pop(index, None)
            self.total += result.count
            self._results[index] = result
            while self._merged in self._results:
                self._merge(self.batches[self._merged], self._results.pop(self._merged))
                self._merged += 1
            if self.stop_over_cap and len(self.matches) >= self.query.max_matches and self.total > len(self.matches):
                self.procs.stop()  # the first max_matches are held, and there are more: enough said

    def _found(self, index: int, count: int) -> None:
        with self.lock:
            self._running[index] = count

    def _progress(self, file_index: int, nbytes: int) -> None:
        with self.lock:
            self.bytes_done += nbytes
            self.file_number = max(self.file_number, file_index + 1)

    def _merge(self, segments: list[Segment], result: BatchResult) -> None:
        if result.segments is None:
            return
        for segment, found in zip(segments, result.segments, strict=True):
            first_line = 0 if segment.start == 0 else self._file_lines.get(segment.file_index, 0)
            for number, line in found.matches:
                if len(self.matches) >= self.query.max_matches:
                    break
                self.matches.append(Match(segment.file.name, first_line + number, line))
            self._file_lines[segment.file_index] = first_line + found.lines
