"""The log files a search may read: a glob expanded inside one root directory, and nothing else.

Nothing outside the root is ever opened. The glob is walked by hand (not with `glob.glob`)
so that a symlinked directory is never listed, wherever it points; a symlinked file is
searched only when its target resolves inside the root. Each file is opened with
`O_NOFOLLOW` at its resolved path and, on Linux, the opened descriptor's path is checked
again, so a link swapped in between the check and the open is refused too.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LogFile",
    "LogSearchError",
    "admit",
    "configured_root",
    "expand",
    "log_root",
    "open_inside",
    "relative_segments",
]

GZIP_MAGIC = b"\x1f\x8b"
_MAGIC_CHARS = frozenset("*?[")


class LogSearchError(ValueError):
    """The caller's arguments cannot be searched (bad glob, regex or timestamp)."""


@dataclass(frozen=True)
class LogFile:
    """One file to search: its name relative to the root, its resolved path, size, compression."""

    name: str
    path: Path
    size: int
    gzip: bool


def log_root(value: str | None = None) -> Path:
    """The resolved root directory: `value`, else the `JOBS_LOG_ROOT` environment variable.

    Raises:
        RuntimeError: no root is configured, or it is not a directory (a deployment problem,
            not the caller's).
    """
    return configured_root("JOBS_LOG_ROOT", "where the logs are", value)


def configured_root(variable: str, purpose: str, value: str | None = None) -> Path:
    """The resolved directory `value`, else the one the environment `variable` names.

    Raises:
        RuntimeError: none is configured, or it is not a directory (the message says the worker
            does not know `purpose`).
    """
    raw = value if value is not None else os.environ.get(variable, "")
    if not raw:
        raise RuntimeError(f"{variable} is not set: the worker does not know {purpose}")
    root = Path(raw).resolve()
    if not root.is_dir():
        raise RuntimeError(f"{variable} {raw!r} is not a directory")
    return root


def split_glob(pattern: str) -> list[str]:
    """The glob's path segments, refused if it could name anything outside the root.

    Raises:
        LogSearchError: empty, absolute, or with a `..` segment.
    """
    if not pattern.strip():
        raise LogSearchError("paths must be a non-empty glob relative to the log root, e.g. 'app/*.log'")
    segments = relative_segments(pattern, "paths", "glob", "the log root", LogSearchError)
    if not segments:
        raise LogSearchError(f"paths {pattern!r} names no file")
    return segments


def relative_segments(path: str, name: str, kind: str, root_name: str, error: type[ValueError]) -> list[str]:
    """The segments of `path` (argument `name`, a `kind` of path) below a root, without `.` and empty ones.

    Raises:
        ValueError: of type `error`, when the path is absolute, has a `..` segment or a NUL character.
    """
    if "\0" in path:
        raise error(f"{name} must not contain NUL characters")
    if path.startswith(("/", "\\")) or os.path.isabs(path):
        raise error(f"{name} {path!r} is absolute; give a {kind} relative to {root_name}")
    segments = [s for s in path.replace("\\", "/").split("/") if s not in ("", ".")]
    if ".." in segments:
        raise error(f"{name} {path!r} escapes {root_name} ('..' is not allowed)")
    return segments


def expand(root: Path, pattern: str) -> tuple[list[LogFile], list[str]]:
    """The regular files under `root` matching `pattern`, sorted by name, and the skipped names.

    `*`, `?` and `[...]` match within one path segment; a `**` segment matches any number of
    directories (symlinked directories are not descended). Skipped names are symlinks whose
    target is outside the root, and matches that are not regular files.

    Raises:
        LogSearchError: the glob is invalid or matches no file.
    """
    files, skipped = admit(root, sorted(set(_walk(root, "", split_glob(pattern)))))
    if not files:
        extra = f" ({'; '.join(skipped[:5])})" if skipped else ""
        raise LogSearchError(f"no file under the log root matches {pattern!r}{extra}")
    return files, skipped


def admit(root: Path, names: list[str]) -> tuple[list[LogFile], list[str]]:
    """The files of `names` (relative to `root`, as `expand` lists them) that may be searched, each
    admitted as `expand` admits it, and the skipped names with the reason."""
    files: list[LogFile] = []
    skipped: list[str] = []
    for name in names:
        reason, real = _admit(root, root / name)
        if reason:
            skipped.append(f"{name}: {reason}")
        if real is None:
            continue
        with open_inside(root, real) as handle:
            size = os.fstat(handle.fileno()).st_size
            files.append(LogFile(name, real, size, handle.read(2) == GZIP_MAGIC))
    return files, skipped


def _walk(root: Path, prefix: str, segments: list[str]) -> Iterator[str]:
    """Names (relative to root) matching `segments` below `prefix`; directories only by lstat."""
    head, rest = segments[0], segments[1:]
    here = root / prefix if prefix else root
    if head == "**":
        if rest:
            yield from _walk(root, prefix, rest)
        for entry in _scandir(here):
            name = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(root, name + "/", segments)
            elif not rest:
                yield name
        return
    if not _MAGIC_CHARS.intersection(head):
        candidates = [head] if os.path.lexists(here / head) else []
    else:
        candidates = [e.name for e in _scandir(here) if fnmatch.fnmatchcase(e.name, head)]
    for cand in candidates:
        name = f"{prefix}{cand}"
        if not rest:
            yield name
        elif (root / name).is_dir() and not (root / name).is_symlink():
            yield from _walk(root, name + "/", rest)


def _scandir(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except (NotADirectoryError, FileNotFoundError, PermissionError):
        return []


def _admit(root: Path, candidate: Path) -> tuple[str, Path | None]:
    """("", resolved path) for a regular file inside the root, ("", None) for a directory, else (reason, None)."""
    real = Path(os.path.realpath(candidate))
    if not real.is_relative_to(root):
        return "outside the log root", None
    try:
        mode = os.stat(real, follow_symlinks=False).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror})", None
    if stat.S_ISDIR(mode):
        return "", None  # a glob like 'app/*' names directories too: not an error, nothing to search
    if not stat.S_ISREG(mode):
        return "not a regular file", None
    return "", real


def open_inside(root: Path, real: Path, root_name: str = "the log root") -> _Handle:
    """Open the resolved path `real` for reading, refusing anything that is not a regular file inside `root`.

    `root_name` names the root in the error ("the repository root").

    Raises:
        PermissionError: the path (or what it has become since it was checked) is outside the root.
        OSError: it cannot be opened, or it is not a regular file.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(real, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{real} is not a regular file")
        proc_link = f"/proc/self/fd/{fd}"
        if os.path.islink(proc_link) and not Path(os.readlink(proc_link)).is_relative_to(root):
            raise PermissionError(f"{real} is outside {root_name}")
    except BaseException:
        os.close(fd)
        raise
    return _Handle(fd)


class _Handle:
    """A raw file descriptor that closes itself: `pread`-style reads, no Python buffering."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def read(self, n: int, offset: int = 0) -> bytes:
        return os.pread(self.fd, n, offset)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
