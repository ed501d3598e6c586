"""Every match of a search as JSON Lines, streamed from rg's output to where it goes, never held whole.

`log_search` writes its `matches.jsonl` artifact with this, once more lines match than it returns
inline: `ctx.artifact(..., data=MatchStream(...))` stores the blocks as they come (Redis in pieces,
an fsspec store as a file written as it goes), so the worker holds a block and its JSON whatever
the number of matches. No Celery.

One rg process per file (`rg --line-number`: its line numbers are the file's own), a few started
ahead so that rg searches the next files while this process encodes. rg reads a plain file itself:
its stdin is the file, opened here inside the root (`open_inside`), so no byte of it is copied
through a pipe (on two cores that copy cost as much CPU as rg's search); a gzip file is inflated
into its stdin by a thread (`jobs._ripgrep.Feeder`). Their output is read in file order, a block
at a time, and turned into JSON Lines in bulk. rg separates the number from the line with a
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
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from jobs._logfiles import LogFile, open_inside
from jobs._logsearch import TICK_S, Progress, Query, validated
from jobs._ripgrep import F_SETPIPE_SZ, PIPE_BYTES, Feeder, ProcessSet, Ripgrep, Segment

__all__ = ["SEPARATOR", "MatchStream", "json_lines"]

#: What rg prints between a line's number and its text: the ASCII unit separator, which text seldom holds.
SEPARATOR = b"\x1f"
READ_BYTES = 1 << 20
#: Every C0 control character but the tab: the newline and the separator among them.
_CONTROLS = bytes(c for c in range(0x20) if c != 0x09)
_ESCAPES = ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\t", b"\\t"))  # the backslash first


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
    """One rg process searching one whole file: a plain file is its stdin, a gzip file is inflated into it.

    A plain file goes to rg as the descriptor `open_inside` opened (inside the root, not a symlink
    out of it): rg reads it itself, with no copy through a pipe, and the descriptor's offset, which
    rg's reads move, is the progress. A gzip file is inflated by a thread of its own (`Feeder`).
    """

    def __init__(self, rg: Ripgrep, root: Path, index: int, log: LogFile, procs: ProcessSet) -> None:
        self.log, self.procs = log, procs
        self.fed = 0  # bytes of a gzip file read so far (the feeder's progress)
        try:
            self.file = None if log.gzip else open_inside(root, log.path)
        except OSError as exc:  # as the feeder reports it: the search fails, naming the file
            raise RuntimeError(f"{log.name}: {exc}") from None
        self.errors: IO[bytes] = tempfile.TemporaryFile()
        try:
            stdin = subprocess.PIPE if self.file is None else self.file.fd
            self.proc = subprocess.Popen(
                rg.command("--line-number", "--field-match-separator=\\x1f"),
                stdin=stdin, stdout=subprocess.PIPE, stderr=self.errors,
            )  # fmt: skip
        except BaseException:
            self.errors.close()
            if self.file is not None:
                self.file.close()
            raise
        procs.add(self.proc)
        self.feeder: Feeder | None = None
        self.pump: threading.Thread | None = None
        if self.file is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):  # a 1 MiB pipe into rg wakes it less
                fcntl.fcntl(self.proc.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
            self.feeder = Feeder(root, [Segment(index, log, 0, log.size)], b"", procs.stopped, self._fed)
            self.pump = threading.Thread(
                target=self.feeder.feed, args=(self.proc.stdin,), name="logstream-feed", daemon=True
            )
            self.pump.start()
        self.prefix = b'{"file":%s,"line_number":' % json.dumps(log.name, ensure_ascii=False).encode()

    def _fed(self, file_index: int, nbytes: int) -> None:
        self.fed += nbytes

    def bytes_read(self) -> int:
        """How far into the file rg (or the feeder, for gzip) has read."""
        if self.file is None:
            return self.fed
        with contextlib.suppress(OSError):  # closed: the search is over
            return min(os.lseek(self.file.fd, 0, os.SEEK_CUR), self.log.size)
        return self.log.size

    def finish(self) -> None:
        """Wait for rg and the feeder.

        Raises:
            RuntimeError: rg failed, or the file could not be read.
        """
        returncode = self.proc.wait()
        self.close()
        if self.feeder is not None and self.feeder.error is not None:
            raise self.feeder.error
        if returncode not in (0, 1) and not self.procs.stopped.is_set():
            self.errors.seek(0)
            raise RuntimeError(f"rg exited with {returncode}: {self.errors.read().decode(errors='replace').strip()}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.pump is not None:
            self.pump.join()
        if self.file is not None:
            self.file.close()
        self.procs.discard(self.proc)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.errors.close()


class MatchStream:
    """Iterating it searches `files` again and yields every match as JSON Lines, in file and line order.

    `lines` counts the lines yielded so far. `tick(progress)` runs between blocks, about every TICK_S
    (not after each block: it asks Redis whether the task was cancelled, and a round trip per block of
    rg's output held the stream back): where the job reports progress and checks for cancel; what it
    raises stops every rg.
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
        self._file_number = 0
        self._bytes_finished = 0  # the bytes of the files searched to their end
        self._reading: _FileSearch | None = None  # the file whose matches are being read

    def __iter__(self) -> Iterator[bytes]:
        procs = ProcessSet()
        ahead: deque[_FileSearch] = deque()
        upcoming = iter(enumerate(self.files))
        try:
            while True:
                while len(ahead) < self.workers and (following := next(upcoming, None)) is not None:
                    ahead.append(_FileSearch(self.rg, self.root, *following, procs))
                if not ahead:
                    return
                search = self._reading = ahead.popleft()
                self._file_number += 1
                yield from self._read(search)
                search.finish()
                self._reading = None
                self._bytes_finished += search.log.size
        finally:
            procs.stop()  # kills rg at once on a cancel or an error; a no-op after a clean end
            for search in [*([self._reading] if self._reading else []), *ahead]:
                search.close()  # its rg waited for, its pipe, file and error file closed

    def _read(self, search: _FileSearch) -> Iterator[bytes]:
        assert search.proc.stdout is not None
        out, carry = search.proc.stdout.fileno(), b""
        next_tick = time.monotonic() + TICK_S
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
            if (now := time.monotonic()) >= next_tick:
                next_tick = now + TICK_S
                self.tick(self.progress())

    def progress(self) -> Progress:
        total = sum(f.size for f in self.files)
        reading = self._reading.bytes_read() if self._reading is not None else 0
        return Progress(self._file_number, len(self.files), self._bytes_finished + reading, total, self.lines)
