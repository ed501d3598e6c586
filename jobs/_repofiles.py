"""The source files a review may read: paths inside `JOBS_REPO_ROOT`, and nothing else.

The same confinement as the log search (`jobs._logfiles`): a path is refused when it is
absolute or has a `..` segment, and when it resolves (symlinks followed) outside the root.
Directories are listed by `rg --files`, which honours `.gitignore` and `.ignore`, skips hidden
files and never follows a symlink; each file it lists is admitted again by its resolved path and
opened with `O_NOFOLLOW` (`open_inside`), so a link swapped in afterwards is refused too. Binary
files (a NUL byte in their first 8 kB) and files over MAX_FILE_BYTES are skipped, and say so.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from jobs._logfiles import LogFile, configured_root, open_inside, relative_segments
from jobs._ripgrep import rg_binary

__all__ = [
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "ROOT_NAME",
    "Listing",
    "ReviewError",
    "list_sources",
    "read_lines",
    "read_text",
    "repo_root",
    "resolve_path",
]

ROOT_NAME = "the repository root"
MAX_FILE_BYTES = 1 << 20  # larger files are generated or data, not code to review
MAX_FILES = 5000
MAX_READ_LINES = 400
MAX_READ_CHARS = 40_000
BINARY_PROBE = 8192
LIST_TIMEOUT_S = 60


class ReviewError(ValueError):
    """The caller's arguments cannot be reviewed: a path outside the root, or nothing to review there."""


@dataclass
class Listing:
    """The files to review under one path, in name order, and those left out (with why)."""

    path: str  # relative to the root, "" for the root itself
    files: list[LogFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def repo_root(value: str | None = None) -> Path:
    """The resolved repository root: `value`, else the `JOBS_REPO_ROOT` environment variable.

    Raises:
        RuntimeError: no root is configured, or it is not a directory (a deployment problem, not the caller's).
    """
    return configured_root("JOBS_REPO_ROOT", "which repository to review", value)


def resolve_path(root: Path, path: str) -> tuple[str, Path]:
    """(`path` normalized relative to the root, its resolved location), for a file or directory inside the root.

    Raises:
        ReviewError: the path is absolute, has `..`, resolves outside the root, or does not exist.
    """
    parts = relative_segments(path, "path", "path", ROOT_NAME, ReviewError)
    real = Path(os.path.realpath(root.joinpath(*parts)))
    if not real.is_relative_to(root):
        raise ReviewError(f"path {path!r} is outside {ROOT_NAME} (a symlink leads out of it)")
    if not real.exists():
        raise ReviewError(f"no file or directory {path!r} under {ROOT_NAME}")
    return "/".join(parts), real


def list_sources(root: Path, path: str) -> Listing:
    """The text files to review at `path` (a file, or a directory listed recursively).

    Raises:
        ReviewError: see `resolve_path`; also when a directory holds no file to review.
        RuntimeError: rg failed to list the directory.
    """
    name, real = resolve_path(root, path)
    listing = Listing(name)
    if real.is_file():
        candidates = [real.relative_to(root).as_posix()]
    else:
        candidates = _rg_files(root, real.relative_to(root).as_posix())
    for candidate in sorted(candidates):
        if len(listing.files) >= MAX_FILES:
            listing.skipped.append(f"{len(candidates) - MAX_FILES} more files: over the limit of {MAX_FILES}")
            break
        reason, found = _admit(root, candidate)
        if found is not None:
            listing.files.append(found)
        elif reason:
            listing.skipped.append(f"{candidate}: {reason}")
    if not listing.files:
        extra = f" ({'; '.join(listing.skipped[:5])})" if listing.skipped else ""
        raise ReviewError(f"no text file to review at {path or '.'!r}{extra}")
    return listing


def _rg_files(root: Path, directory: str) -> list[str]:
    # --no-require-git: honour .gitignore in an export or a checkout without its .git as well.
    args = [rg_binary(), "--files", "--no-config", "--no-require-git", "--no-messages", "--color=never"]
    done = subprocess.run(
        [*args, *([directory] if directory not in ("", ".") else [])],
        cwd=root,
        capture_output=True,
        timeout=LIST_TIMEOUT_S,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: no file at all
        raise RuntimeError(f"rg --files failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()}")
    return [line.removeprefix("./") for line in done.stdout.decode(errors="replace").splitlines() if line]


def _admit(root: Path, name: str) -> tuple[str, LogFile | None]:
    """The file to review, or why not (an empty reason: quietly nothing)."""
    real = Path(os.path.realpath(root / name))
    if not real.is_relative_to(root):
        return "outside the repository root", None
    try:
        mode = os.stat(real, follow_symlinks=False)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})", None
    if not stat.S_ISREG(mode.st_mode):
        return "not a regular file", None
    if mode.st_size > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES >> 20} MB", None
    with open_inside(root, real, ROOT_NAME) as handle:
        if b"\0" in handle.read(BINARY_PROBE):
            return "binary", None
    return "", LogFile(PurePosixPath(name).as_posix(), real, mode.st_size, gzip=False)


def read_text(root: Path, file: LogFile) -> str:
    """The whole file as text (UTF-8; undecodable bytes replaced), read through `open_inside`."""
    with open_inside(root, file.path, ROOT_NAME) as handle:
        return handle.read(MAX_FILE_BYTES + 1).decode(errors="replace")


def read_lines(root: Path, path: str, start: int = 1, end: int | None = None) -> tuple[str, int, int, int]:
    """Lines `start`..`end` (1-based, inclusive) of the file at `path`, numbered like `cat -n`.

    At most MAX_READ_LINES lines and MAX_READ_CHARS characters: a longer range is cut, and the
    range returned says where. Returns (text, first line, last line, lines in the file).

    Raises:
        ReviewError: the path is refused (see `resolve_path`), is not a text file, or start is past the end.
    """
    name, real = resolve_path(root, path)
    if not real.is_file():
        raise ReviewError(f"{path!r} is a directory; read takes a file")
    reason, file = _admit(root, real.relative_to(root).as_posix())
    if file is None:
        raise ReviewError(f"{name} cannot be read: {reason}")
    lines = read_text(root, file).splitlines()
    first = max(1, start)
    if lines and first > len(lines):
        raise ReviewError(f"{name} has {len(lines)} lines; start {start} is past the end")
    last = min(len(lines), end if end is not None else first + MAX_READ_LINES - 1, first + MAX_READ_LINES - 1)
    out: list[str] = []
    size = 0
    for number in range(first, last + 1):
        line = f"{number:6}\t{lines[number - 1]}"
        if size + len(line) > MAX_READ_CHARS and out:
            last = number - 1
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out), first, max(last, first - 1), len(lines)
