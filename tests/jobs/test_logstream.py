"""Every match of a log search as JSON Lines (`jobs._logstream`): the bulk encoding against `json.dumps` line by
line, and the stream against the first pass (`jobs._logsearch.search`) and `grep -c`, on real rg processes.

No Celery here: `log_search` hands the stream to `ctx.artifact` (tests/store/test_artifacts.py runs it end to end).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from jobs._logfiles import expand
from jobs._logfilters import LineFilter
from jobs._logsearch import BOUNDARY_SCAN, FIRST_BYTES, TICK_S, Progress, Query, search, search_files
from jobs._logstream import SEPARATOR, MatchStream, json_lines
from tests.support.logdata import BLOCK, BLOCK_ERRORS, big_gzip, log_lines, rg_processes, write

PREFIX = b'{"file":"a.log","line_number":'


def rg_block(lines: list[tuple[int, bytes]]) -> bytes:
    """What `rg --line-number --field-match-separator=\\x1f` prints for these (number, line) pairs."""
    return b"".join(b"%d%s%s\n" % (number, SEPARATOR, text) for number, text in lines)


def reference(lines: list[tuple[int, bytes]]) -> list[dict[str, object]]:
    """What each line must read as: the first pass's reading of it (trailing CR dropped, bad UTF-8 replaced)."""
    return [
        {"file": "a.log", "line_number": n, "line": text.removesuffix(b"\r").decode(errors="replace")}
        for n, text in lines
    ]


def decoded(encoded: bytes) -> list[dict[str, object]]:
    assert encoded.endswith(b"\n")
    return [json.loads(line) for line in encoded.decode().split("\n")[:-1]]  # strict: a raw control char fails


PLAIN = [(1, b"2026-11-30T00:00:00.000Z ERROR [api] GET /v1 500"), (7, b"ERROR again"), (12, b"x")]
TRICKY = {
    "quotes and backslashes": [(3, b'path="C:\\\\temp\\\\x" said \\"hi\\"'), (4, b"a\\")],
    "tabs": [(1, b"a\tb\t\tc"), (2, b"\t")],
    "CRLF line ends": [(1, b"windows line\r"), (5, b"another\r")],
    "a lone CR inside": [(1, b"a\rb"), (2, b"ok")],
    "other control characters": [(1, b"bell \x07 esc \x1b[31m nul \x00"), (2, b"form\x0cfeed")],
    "bytes that are not UTF-8": [(1, b"caf\xe9 \xff\xfe"), (2, b"fine")],
    "UTF-8 beyond ASCII": [(1, "ünïcode ✓ 日本語 \u2028 end".encode()), (2, "\U0001f600".encode())],
    "the separator in a line": [(1, b"a\x1fb"), (2, b"c")],
    "an empty line": [(9, b"")],
    "DEL": [(1, b"del \x7f ok")],
}


@pytest.mark.parametrize("lines", [PLAIN, *TRICKY.values()], ids=["plain", *TRICKY])
def test_a_block_reads_as_json_dumps_reads_each_line(lines: list[tuple[int, bytes]]) -> None:
    encoded, count = json_lines(rg_block(lines), PREFIX)
    assert count == len(lines)
    assert decoded(encoded) == reference(lines)


def test_plain_lines_and_tricky_ones_in_one_block_all_read_right() -> None:
    lines = [(i, text) for i, (_, text) in enumerate([*PLAIN, *(x for v in TRICKY.values() for x in v)], 1)]
    encoded, count = json_lines(rg_block(lines), PREFIX)
    assert count == len(lines) and decoded(encoded) == reference(lines)


def test_a_filter_keeps_only_the_lines_it_accepts() -> None:
    lines = [(1, b"keep me"), (2, b"drop me"), (3, b"keep too\r")]
    encoded, count = json_lines(rg_block(lines), PREFIX, lambda line: line.startswith("keep"))
    assert count == 2 and decoded(encoded) == [reference(lines)[0], reference(lines)[2]]


def test_an_empty_block_is_nothing() -> None:
    assert json_lines(b"", PREFIX) == (b"", 0)


def every_match(root: Path, paths: str, query: Query, workers: int = 2) -> tuple[MatchStream, list[dict[str, object]]]:
    files, _ = expand(root, paths)
    stream = MatchStream(root, files, query, workers=workers)
    chunks = list(stream)
    return stream, decoded(b"".join(chunks)) if chunks else []


def test_the_stream_holds_what_the_first_pass_finds_in_the_same_order(tmp_path: Path) -> None:
    write(tmp_path / "a/api.log", log_lines(30_000, seed=1))
    write(tmp_path / "a/crlf.log", ["x ERROR windows\r", "ok\r", "ERROR \x1b[31mred\x1b[0m\r"])
    write(tmp_path / "a/gz.log.gz", log_lines(20_000, seed=2), gz=True)
    write(tmp_path / "a/last.log", ["no newline at the end ERROR"], final_newline=False)
    (tmp_path / "a/latin1.log").write_bytes(b"caf\xe9 ERROR\n" + b"x ERROR " * 500 + b"\n")
    write(tmp_path / "a/quotes.log", ['{"level": "ERROR", "path": "C:\\\\x", "tab": "\t"}'] * 3)
    for query in (Query("ERROR"), Query("ERROR", line_filter=LineFilter.build("2026-11-30T02:00:00Z", None, None))):
        first = search(tmp_path, "a/*", Query(query.pattern, line_filter=query.line_filter, max_matches=10**6))
        stream, objects = every_match(tmp_path, "a/*", query)
        assert stream.lines == len(objects) == first.total_matches > 1000
        assert [(o["file"], o["line_number"], o["line"]) for o in objects] == [
            (m.file, m.line_number, m.line) for m in first.matches
        ]


def test_the_stream_counts_as_grep_does_on_a_file_cut_into_segments(tmp_path: Path) -> None:
    """A file bigger than the first pass's segments (64 MiB) is one rg process here: its own line numbers."""
    lines = log_lines(50_000, seed=3)
    write(tmp_path / "big.log", lines * 40)  # 2 million lines, ~130 MB
    grep = subprocess.run(["grep", "-c", "ERROR", str(tmp_path / "big.log")], capture_output=True, text=True)
    stream, objects = every_match(tmp_path, "big.log", Query("ERROR"))
    assert stream.lines == len(objects) == int(grep.stdout)
    last = max(n for n, line in enumerate(lines * 40, 1) if "ERROR" in line)
    assert objects[-1]["line_number"] == last


def test_a_first_pass_that_stops_over_the_cap_holds_the_same_first_matches_and_reads_little(tmp_path: Path) -> None:
    write(tmp_path / "big.log", log_lines(50_000, seed=4) * 8)  # 400,000 lines, ~30 MB
    write(tmp_path / "more.log", log_lines(1000, seed=5))
    files, _ = expand(tmp_path, "*.log")
    full = search_files(tmp_path, files, Query("ERROR", max_matches=500))
    for workers in (1, 2):
        stopped = search_files(tmp_path, files, Query("ERROR", max_matches=500), stop_over_cap=True, workers=workers)
        assert [(m.file, m.line_number, m.line) for m in stopped.matches] == [
            (m.file, m.line_number, m.line) for m in full.matches
        ]
        assert full.total_matches > stopped.total_matches > 500  # more than the cap: all it says
        if workers == 1:  # the small first batch held enough: no later batch started (with two rg at once,
            # how much the second reads before it is killed depends on the machine's load)
            assert stopped.bytes_scanned <= FIRST_BYTES + BOUNDARY_SCAN < full.bytes_scanned / 20
    few = search_files(tmp_path, files, Query("ERROR", max_matches=10**6), stop_over_cap=True)
    assert few.total_matches == full.total_matches == len(few.matches)  # under the cap: the whole count


def test_a_tick_that_raises_stops_the_stream_and_kills_rg(tmp_path: Path) -> None:
    big_gzip(tmp_path / "big.log.gz", members=300)
    files, _ = expand(tmp_path, "*.gz")

    class Stop(BaseException):
        pass

    ticks = []

    def tick(progress: object) -> None:
        ticks.append(progress)
        if len(ticks) == 3:
            raise Stop

    stream = MatchStream(tmp_path, files, Query("ERROR"), tick=tick)
    with pytest.raises(Stop):
        for _ in stream:
            time.sleep(TICK_S)  # a tick per block, so the third comes midway however fast the machine is
    assert rg_processes(parent=os.getpid()) == []
    assert 0 < stream.lines < BLOCK_ERRORS * 300  # stopped midway


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_tick_that_raises_midway_through_a_plain_file_kills_rg_and_closes_what_the_search_opened(
    tmp_path: Path,
) -> None:
    """rg reads a plain file itself (its stdin is the file): stopped, it is killed and the file closed."""
    write(tmp_path / "big.log", BLOCK * 60)  # 1.2 million lines, ~90 MB
    files, _ = expand(tmp_path, "*.log")
    before = open_fds()

    class Stop(BaseException):
        pass

    seen: list[int] = []

    def tick(progress: Progress) -> None:
        seen.append(progress.bytes_done)
        if len(seen) == 3:
            raise Stop

    stream = MatchStream(tmp_path, files, Query("ERROR"), tick=tick, workers=2)
    with pytest.raises(Stop):
        for _ in stream:
            # A reader as slow as a tick per block: the third tick comes after the third block (of
            # about eight), whatever the machine's speed. A fast machine read all within 3 ticks.
            time.sleep(TICK_S)
    assert rg_processes(parent=os.getpid()) == []
    assert open_fds() == before  # the log file, rg's pipe and its error file: all closed
    assert 0 < stream.lines < BLOCK_ERRORS * 60 and 0 < seen[-1] < files[0].size  # stopped midway


def test_ticks_come_about_every_tick_s_not_after_every_block(tmp_path: Path) -> None:
    """Each tick is a Redis round trip in the job (the cancel check): one per block of rg's output held the
    stream back behind Redis. Progress reaches every byte of the files, plain and gzip."""
    write(tmp_path / "a.log", BLOCK * 30)
    big_gzip(tmp_path / "b.log.gz", members=20)
    files, _ = expand(tmp_path, "*")
    ticks: list[tuple[float, Progress]] = []
    stream = MatchStream(tmp_path, files, Query("ERROR"), tick=lambda p: ticks.append((time.monotonic(), p)))
    blocks = sum(1 for _ in stream)
    assert stream.lines == BLOCK_ERRORS * 50 and blocks > 10
    gaps = [b[0] - a[0] for a, b in zip(ticks, ticks[1:], strict=False)]
    assert all(gap >= TICK_S * 0.9 for gap in gaps), min(gaps)
    done = [p.bytes_done for _, p in ticks]
    assert done == sorted(done) and stream.progress().bytes_done == sum(f.size for f in files)


def test_a_file_swapped_for_a_symlink_out_of_the_root_after_the_listing_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    write(outside / "secret.log", ["2026-11-30T00:00:00Z ERROR secret-marker"])
    write(root / "app.log", ["2026-11-30T00:00:00Z ERROR mine"])
    files, _ = expand(root, "*.log")
    (root / "app.log").unlink()
    (root / "app.log").symlink_to(outside / "secret.log")  # as if swapped in after expand()
    with pytest.raises(RuntimeError, match="app.log"):
        list(MatchStream(root, files, Query("ERROR")))
    assert rg_processes(parent=os.getpid()) == []
