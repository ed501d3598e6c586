"""python -m bench.logsearch_engines [--size-mb 256]: why `log_search` runs ripgrep.

Counts the lines matching the patterns of bench/logsearch.py in a generated log, with each
candidate engine used the way a search job would have to use it: Python's `re` and
`bytes.find`, RE2 (`google-re2`) and Hyperscan (`hyperscan`) on the log in memory on one core,
and ripgrep the way log_search runs it (jobs._logsearch.search: rg fed through pipes from the
page cache) on one and on two cores. RE2 and Hyperscan are optional (`pip install google-re2
hyperscan`). Counting matching *lines* means skipping to the next line after each hit (re,
RE2, find) or dropping the hits on an already counted line (Hyperscan, whose callback runs in
Python once per hit). Median of 3 runs each. Prints a table and writes it to --out
(default bench/results-logsearch-engines.md).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.logsearch import CASES, generate_log
from jobs._logsearch import Query, search

Counter = Callable[[bytes], int]


def by_search(search: Callable[[bytes, int], Any]) -> Counter:
    """Count matching lines with a `search(data, pos) -> match | None` API: one call per matching line."""

    def count(data: bytes) -> int:
        lines, pos = 0, 0
        while (found := search(data, pos)) is not None:
            lines += 1
            pos = data.find(b"\n", found.end()) + 1
            if pos == 0:
                break
        return lines

    return count


def by_find(literal: bytes) -> Counter:
    def count(data: bytes) -> int:
        lines, pos = 0, 0
        while (pos := data.find(literal, pos)) >= 0:
            lines += 1
            pos = data.find(b"\n", pos) + 1
            if pos == 0:
                break
        return lines

    return count


def by_hyperscan(regex: bytes) -> Counter | None:
    try:
        import hyperscan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[regex], ids=[0], elements=1, flags=[0])

    def count(data: bytes) -> int:
        state = {"lines": 0, "line_end": -1}

        def on_match(_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            if end > state["line_end"]:
                state["lines"] += 1
                newline = data.find(b"\n", end - 1)
                state["line_end"] = newline if newline >= 0 else len(data)

        database.scan(data, match_event_handler=on_match)
        return state["lines"]

    return count


def by_re2(regex: bytes) -> Counter | None:
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    compiled = re2.compile(regex)
    return by_search(lambda data, pos: compiled.search(data, pos))


def by_log_search(path: Path, pattern: str, literal: bool, workers: int) -> Counter:
    """jobs._logsearch.search on the file (page cache): rg fed through pipes, `workers` at once."""
    query = Query(pattern, regex=not literal, max_matches=1000)
    return lambda data: search(path.parent, path.name, query, workers=workers).total_matches


def engines(path: Path, pattern: str, literal: bool) -> dict[str, Counter | None]:
    regex = re.escape(pattern).encode() if literal else pattern.encode()
    compiled = re.compile(regex)
    found: dict[str, Counter | None] = {"python re": by_search(lambda data, pos: compiled.search(data, pos))}
    if literal:
        found["python bytes.find"] = by_find(pattern.encode())
    found |= {"RE2": by_re2(regex), "Hyperscan": by_hyperscan(regex)}
    for workers in (1, 2):
        found[f"rg as log_search runs it, {workers} core(s)"] = by_log_search(path, pattern, literal, workers)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.logsearch_engines", description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results-logsearch-engines.md")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="logsearch-engines-") as workdir:
        path = Path(workdir) / "sample.log"
        generate_log(path, options.size_mb * 1_000_000)
        data = path.read_bytes()
        lines = [
            "# Candidate engines for log_search",
            "",
            f"`python -m bench.logsearch_engines --size-mb {options.size_mb}` on {os.cpu_count()} cores "
            f"(shared: the machine's load average was {os.getloadavg()[0]:.1f} at the start). "
            f"{len(data) / 1e6:.0f} MB of generated log, in memory (or the page cache for rg); "
            "time and GB/s to count the matching lines.",
            "",
        ]
        lines += _table(path, data)
    options.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {options.out}")
    return 0


def _table(path: Path, data: bytes) -> list[str]:
    rows = ["| pattern | engine | matching lines | seconds | GB/s |", "|---|---|---:|---:|---:|"]
    print("\n".join(rows))
    for kind, pattern, _ in CASES:
        for name, counter in engines(path, pattern, kind == "literal").items():
            if counter is None:
                rows.append(f"| `{pattern}` | {name} | not installed | | |")
                print(rows[-1])
                continue
            times = []
            for _ in range(3):
                started = time.perf_counter()
                lines = counter(data)
                times.append(time.perf_counter() - started)
            seconds = statistics.median(times)
            rows.append(f"| `{pattern}` | {name} | {lines:,} | {seconds:.3f} | {len(data) / seconds / 1e9:.2f} |")
            print(rows[-1])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
