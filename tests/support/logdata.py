"""Generated logs and process checks for the log_search tests (tests/jobs/test_logs_job.py)."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support.harness import live_processes

LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]
MESSAGES = [
    "GET /v1/orders/{n} 200 latency_ms={ms}",
    "connection reset by peer host=db-{n}",
    "upstream timeout after {ms} ms",
    "user={n} logged in",
    "disk usage {ms}% on /dev/sda",
]
START = datetime(2026, 11, 30, tzinfo=UTC)


def log_lines(count: int, seed: int = 0, start: datetime = START) -> list[str]:
    """Realistic lines: ISO timestamp, level, service, message; one second apart."""
    rnd = random.Random(seed)
    lines = []
    for i in range(count):
        stamp = (start + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        message = rnd.choice(MESSAGES).format(n=rnd.randrange(1000), ms=rnd.randrange(2000))
        lines.append(f"{stamp} {rnd.choice(LEVELS):5} [api] {message}")
    return lines


def write(path: Path, lines: list[str], *, gz: bool = False, final_newline: bool = True) -> Path:
    data = ("\n".join(lines) + ("\n" if final_newline else "")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def expected(
    files: dict[str, list[str]], keep: Callable[[str], bool], cap: int = 1000
) -> tuple[int, list[tuple[str, int, str]]]:
    """The reference answer: (matching lines, the first `cap` as (file, line number, line)), files in name order."""
    found = [(name, n, line) for name in sorted(files) for n, line in enumerate(files[name], 1) if keep(line)]
    return len(found), found[:cap]


def as_tuples(result: object) -> list[tuple[str, int, str]]:
    return [(m.file, m.line_number, m.line) for m in result.matches]  # type: ignore[attr-defined]


def rg_processes(*, parent: int | None = None, group: int | None = None) -> list[int]:
    """Live rg processes with this parent pid or in this process group."""
    return [pid for pid, comm, ppid, pgrp in live_processes() if comm == "rg" and (ppid == parent or pgrp == group)]


BLOCK = log_lines(20_000, seed=9)
BLOCK_ERRORS = sum("ERROR" in line for line in BLOCK)


def big_gzip(path: Path, members: int) -> None:
    """A gzip file of `members` copies of one compressed block: quick to write, long to search."""
    member = gzip.compress(("\n".join(BLOCK) + "\n").encode(), 6)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for _ in range(members):
            out.write(member)
