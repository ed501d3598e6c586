"""Every match of a search as JSON Lines, streamed from rg's output to where it goes, never held whole.

`log_search` writes its `matches.jsonl` artifact with this, once more lines match than it returns
inline: `ctx.artifact(..., data=MatchStream(...))` stores the blocks as they come (Redis in pieces,
an fsspec store as a file written as it goes), so the worker holds a block and its JSON whatever
the number of matches. No Celery.

One rg process per file (`rg --line-number`: its line numbers are the file's own), fed as the first
pass feeds it (`jobs._ripgrep.Feeder`: `sendfile`, or gzip inflated here), a few started ahead so
that rg searches the next files while this process encodes; their output is read in file order, a
MiB at a time, and turned into JSON Lines in bulk. rg separates the number from the line with a
byte no log line has (`--field-match-separator`), so a block of complete lines becomes JSON with a
few `bytes.replace` calls over the whole block (escape backslashes, quotes and tabs; then the
separator and each newline become the objects' glue), not one `json.dumps` per line. A block holding
what those cannot encode (another control character, bytes that are not UTF-8, the separator in a
line) goes line by line, as does every line when a time or level filter must look at it.

A line reads as in the first pass (`jobs._ripgrep`): its trailing CR dropped, bytes that are not
UTF-8 replaced (U+FFFD), a line over MAX_LINE_CHARS cut by rg.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from jobs._logfiles import LogFile
from jobs._logsearch import TICK_S, Progress, Query, validated
from jobs._ripgrep import F_SETPIPE_SZ, PIPE_BYTES, Feeder, ProcessSet, Ripgrep, Segment

__all__ = ["SEPARATOR", "MatchStream", "json_lines"]

#: What rg prints between a line's number and its text: the ASCII unit separator, which text seldom holds.
SEPARATOR = b"\x1f"
READ_BYTES = 1 << 20
#: Every C0 control character but the tab: the newline and the separator among them.
_CONTROLS = bytes(c for c in range(0x20) if c != 0x09)
_ESCAPES = ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\t", b"\\t"))  # the backslash first
#: `progress(file_index, nbytes)`, from the feeder threads (`Feeder`).
_Fed = Callable[[int, int], None]


def json_lines(block: bytes, prefix: bytes, accept: Callable[[str], bool] | None = None) -> tuple[bytes, int]:
    """`block`, complete lines of rg's output (`N<SEPARATOR>text\\n`), as JSON Lines; and how many.

    `prefix` opens each object (`{"file":"NAME","line_number":`); `accept(line)`, when given, keeps a
    line or leaves it out (a time or level filter).
    """
    if not block:
        return b"", 0
    lines = block.count(b"\n")
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n")
    # Exactly a newline and a separator per line, no other control character, and UTF-8: the fast path.
    if accept is None and len(block) - len(block.translate(None, _CONTROLS)) == 2 * lines and _utf8(block):
        for raw, escaped in _ESCAPES:
            if raw in block:
                block = block.replace(raw, escaped)
        body = block.replace(SEPARATOR, b',"line":"').replace(b"\n", b'"}\n' + prefix)
        return prefix + body[: -len(prefix)], lines
    return _one_by_one(block, prefix, accept)


def _utf8(block: bytes) -> bool:
    if block.isascii():
        return True
    try:
        block.decode()
    except UnicodeDecodeError:
        return False
    return True


def _one_by_one(block: bytes, prefix: bytes, accept: Callable[[str], bool] | None) -> tuple[bytes, int]:
    out = []
    for raw in block.split(b"\n")[:-1]:  # not splitlines(): a lone \r is not a line break
        number, _, text = raw.partition(SEPARATOR)
        line = text.removesuffix(b"\r").decode(errors="replace")
        if accept is None or accept(line):
            out.append(b'%s%s,"line":%s}\n' % (prefix, number, json.dumps(line, ensure_ascii=False).encode()))
    return b"".join(out), len(out)


class _FileSearch:
    """One rg process searching one whole file, fed by a thread of its own."""

    def __init__(self, rg: Ripgrep, root: Path, index: int, log: LogFile, procs: ProcessSet, progress: _Fed) -> None:
        self.errors: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            rg.command("--line-number", "--field-match-separator=\\x1f"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
        )  # fmt: skip
        procs.add(self.proc)
        self.procs = procs
        assert self.proc.stdout is not None and self.proc.stdin is not None
        with contextlib.suppress(OSError):  # a 1 MiB pipe into rg wakes it less (its output's stays small:
            fcntl.fcntl(self.proc.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)  # blocks of it are what we hold)
        self.feeder = Feeder(root, [Segment(index, log, 0, log.size)], b"", procs.stopped, progress)
        self.pump = threading.Thread(
            target=self.feeder.feed, args=(self.proc.stdin,), name="logstream-feed", daemon=True
        )
        self.pump.start()
        self.prefix = b'{"file":%s,"line_number":' % json.dumps(log.name, ensure_ascii=False).encode()

    def finish(self) -> None:
        """Wait for rg and the feeder.

        Raises:
            RuntimeError: rg failed, or the file could not be read.
        """
        returncode = self.proc.wait()
        self.close()
        if self.feeder.error is not None:
            raise self.feeder.error
        if returncode not in (0, 1) and not self.procs.stopped.is_set():
            self.errors.seek(0)
            raise RuntimeError(f"rg exited with {returncode}: {self.errors.read().decode(errors='replace').strip()}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.pump.join()
        self.procs.discard(self.proc)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.errors.close()


class MatchStream:
    """Iterating it searches `files` again and yields every match as JSON Lines, in file and line order.

    `lines` counts the lines yielded so far. `tick(progress)` runs between blocks, at least every
    TICK_S: where the job reports progress and checks for cancel; what it raises stops every rg.
    """

    def __init__(
        self,
        root: Path,
        files: list[LogFile],
        query: Query,
        *,
        tick: Callable[[Progress], None] | None = None,
        workers: int = 1,
    ) -> None:
        self.rg = validated(root, query)
        self.root, self.files, self.workers = root, files, max(1, workers)
        self.accept = query.line_filter.accepts if query.line_filter.active else None
        self.tick = tick or (lambda progress: None)
        self.lines = 0
        self._bytes_done, self._file_number = 0, 0
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        procs = ProcessSet()
        ahead: deque[_FileSearch] = deque()
        upcoming = iter(enumerate(self.files))
        try:
            while True:
                while len(ahead) < self.workers and (following := next(upcoming, None)) is not None:
                    ahead.append(_FileSearch(self.rg, self.root, *following, procs, self._progress))
                if not ahead:
                    return
                search = ahead.popleft()
                self._file_number += 1
                yield from self._read(search)
                search.finish()
        finally:
            procs.stop()  # kills rg at once on a cancel or an error; a no-op after a clean end
            for search in ahead:
                search.close()

    def _read(self, search: _FileSearch) -> Iterator[bytes]:
        assert search.proc.stdout is not None
        out, carry = search.proc.stdout.fileno(), b""
        while True:
            if select.select([out], [], [], TICK_S)[0]:
                block = os.read(out, READ_BYTES)
                if not block:
                    return
                cut = block.rfind(b"\n") + 1
                if not cut:  # no line ends in it: wait for the rest
                    carry += block
                    continue
                complete, carry = carry + block[:cut], block[cut:]
                encoded, count = json_lines(complete, search.prefix, self.accept)
                self.lines += count
                if encoded:
                    yield encoded
            self.tick(self.progress())

    def _progress(self, file_index: int, nbytes: int) -> None:
        with self._lock:
            self._bytes_done += nbytes

    def progress(self) -> Progress:
        total = sum(f.size for f in self.files)
        return Progress(self._file_number, len(self.files), self._bytes_done, total, self.lines)
