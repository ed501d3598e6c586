"""Artifacts in a file system or object store (`MCP_CELERY_ARTIFACTS=<fsspec URL>`): where each file goes,
and which folders are mcp-celery's to remove.

Tier 1 (fsspec; no Redis). Under the URL's root, a deployment keeps its artifacts in a folder named
after its key prefix, one folder per task, and writes a marker into each task folder before any
artifact:

    ROOT/<MCP_CELERY_KEY_PREFIX>/<taskId>/..mcp-celery-task    the marker (who wrote the folder)
    ROOT/<MCP_CELERY_KEY_PREFIX>/<taskId>/<name>               each artifact

The deployment's folder keeps two deployments on one root apart; the marker tells a task folder
that mcp-celery wrote from anything else a person puts there. The sweep
(`mcp_celery.server.engine.artifacts`) lists the deployment's folder only, and removes a folder of it
only when the task's record is gone *and* the folder holds the marker: a person's files and
folders under ROOT, a folder named like a task id that mcp-celery did not write, and another
deployment's folders are never touched. The marker's name contains `..`, which no artifact name
may (`check_name`), so a job can neither overwrite nor fake it.

Releases before this layout wrote `ROOT/<taskId>/<name>`: a read falls back to that path, so the
tasks that were live at an upgrade keep their artifacts until they expire. Nothing removes those
folders any more (docs/guides/artifacts.md says how to clear them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Generator, Iterable
from pathlib import Path

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from mcp_celery.errors import ConfigurationError
from mcp_celery.store.artifacts import CHUNK, REDIS, check_name

__all__ = ["MARKER", "FsspecArtifacts", "check_store", "fsspec_store"]

#: The file mcp-celery writes into each task folder before its first artifact: the sweep removes only
#: folders that hold it. An artifact may not be called so (its name contains '..').
MARKER = "..mcp-celery-task"


class FsspecArtifacts:
    """Artifacts in an fsspec file system: `<root>/<key prefix>/<taskId>/<name>`."""

    def __init__(self, url: str, prefix: str) -> None:
        if not prefix or "/" in prefix or "\\" in prefix or prefix in (".", "..") or not prefix.isprintable():
            raise ConfigurationError(
                f"MCP_CELERY_KEY_PREFIX={prefix!r} names the deployment's folder under MCP_CELERY_ARTIFACTS: "
                "use one path segment of printable characters, without '/'"
            )
        try:
            fs, root = url_to_fs(url)
        except (ImportError, ValueError) as exc:  # e.g. s3:// without s3fs installed
            raise ConfigurationError(f"MCP_CELERY_ARTIFACTS={url!r}: {exc}") from exc
        self.url = url
        self.fs: fsspec.AbstractFileSystem = fs
        self.root = root.rstrip("/")
        #: The deployment's folder: every task folder this deployment writes, and nothing else, is in it.
        self.folder = f"{self.root}/{prefix}"
        self._marker = json.dumps({"writer": "mcp-celery", "key_prefix": prefix}).encode()

    def task_folder(self, task_id: str) -> str:
        return f"{self.folder}/{task_id}"

    def path(self, task_id: str, name: str) -> str:
        return f"{self.task_folder(task_id)}/{check_name(name)}"

    def check(self) -> None:
        """Write a file into the deployment's folder and remove it, so that a server or worker stops at start,
        not a job later, where artifacts cannot be kept.

        Raises:
            ConfigurationError: the folder cannot be written: a bucket that does not exist, refused
                credentials, a read-only volume, an unreachable endpoint.
        """
        probe = f"{self.folder}/.mcp-celery-probe-{uuid.uuid4().hex}"
        try:
            self._make_folder(self.folder)
            self.fs.pipe_file(probe, b"")
            self.fs.rm(probe)
        except Exception as exc:  # noqa: BLE001 - whatever the store raises (s3fs, botocore, OSError), it cannot keep artifacts
            raise ConfigurationError(
                f"MCP_CELERY_ARTIFACTS={self.url!r}: cannot write {self.folder}: {_why(exc)}"
            ) from exc

    def put_bytes(self, task_id: str, name: str, data: bytes) -> None:
        self._mark(task_id)
        self.fs.pipe_file(self.path(task_id, name), data)

    def put_file(self, task_id: str, name: str, local: Path) -> None:
        self._mark(task_id)
        self.fs.put_file(str(local), self.path(task_id, name))

    def put_stream(self, task_id: str, name: str, chunks: Iterable[bytes]) -> tuple[int, str]:
        """Write `chunks` into the artifact's file as they come (an object store uploads it in parts);
        its size and SHA-256. Whatever stops it (the store, or `chunks` raising) removes the file."""
        self._mark(task_id)
        path = self.path(task_id, name)
        digest, size = hashlib.sha256(), 0
        try:
            with self.fs.open(path, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        except BaseException:
            with contextlib.suppress(Exception):  # nothing written, or already gone: the first error stands
                self.fs.rm(path)
            raise
        return size, digest.hexdigest()

    def remove(self, task_id: str, name: str) -> None:
        path = self.path(task_id, name)
        if self.fs.exists(path):
            self.fs.rm(path)

    def read(self, task_id: str, name: str, start: int, end: int) -> Generator[bytes, None, None]:
        """The bytes `start` to `end` (exclusive), a chunk at a time."""
        try:
            file = self.fs.open(self.path(task_id, name), "rb")
        except FileNotFoundError:  # written before the deployment's folder: ROOT/<taskId>/<name>
            file = self.fs.open(f"{self.root}/{task_id}/{check_name(name)}", "rb")
        with file:
            file.seek(start)
            left = end - start
            while left > 0 and (chunk := file.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk

    def task_folders(self) -> list[str]:
        """The names of the folders in the deployment's folder (the sweep's candidates; files are left out)."""
        self.fs.invalidate_cache(self.folder)  # an object store's listing is cached: the sweep wants today's
        if not self.fs.exists(self.folder):
            return []
        entries = self.fs.ls(self.folder, detail=True)
        return [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"]

    def remove_task(self, task_id: str) -> bool:
        """Remove a task's folder and everything in it if mcp-celery wrote it (it holds the marker); whether it did."""
        folder = self.task_folder(task_id)
        self.fs.invalidate_cache(folder)
        if not self.fs.exists(f"{folder}/{MARKER}"):
            return False  # not written by mcp-celery, whatever its name: never ours to remove
        with contextlib.suppress(FileNotFoundError):  # another server removed it meanwhile
            self.fs.rm(folder, recursive=True)
        return True

    def _mark(self, task_id: str) -> None:
        """The task's folder, with the marker in it (before any artifact, so none is ever left unmarked)."""
        folder = self.task_folder(task_id)
        self._make_folder(self.folder)
        self._make_folder(folder)
        self.fs.pipe_file(f"{folder}/{MARKER}", self._marker)

    def _make_folder(self, path: str) -> None:
        """A folder and, on a local disk, those above it. Elsewhere not `makedirs`: an object store's makes
        the bucket that is missing (s3fs, gcsfs), which must stay an error; without parents it makes nothing."""
        if isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(path, exist_ok=True)
            return
        with contextlib.suppress(FileExistsError):
            self.fs.mkdir(path, create_parents=False)


def _why(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"not found (does the bucket or volume exist?): {exc}"
    if isinstance(exc, PermissionError):
        return f"refused (check the credentials, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY): {exc}"
    return f"{type(exc).__name__}: {exc}"


def fsspec_store(setting: str, prefix: str) -> FsspecArtifacts | None:
    """The fsspec store `MCP_CELERY_ARTIFACTS` names, for the deployment of key prefix `prefix`; None for `redis`."""
    return None if setting == REDIS else FsspecArtifacts(setting, prefix)


def check_store(setting: str, prefix: str) -> None:
    """At a server's or a worker's start: an fsspec store must take a file (`FsspecArtifacts.check`).

    Raises:
        ConfigurationError: it cannot (the message says why and names MCP_CELERY_ARTIFACTS).
    """
    files = fsspec_store(setting, prefix)
    if files is not None:
        files.check()
