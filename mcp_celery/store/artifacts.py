"""Artifacts: the files a job hands over beside its result, their names, URIs and where their bytes live.

Tier 1 (redis-free; fsspec for the stores that are not Redis). A task's artifact `report.csv` is

- a field `art:report.csv` of the task's record, holding its `ArtifactMeta` (JSON: size, MIME type,
  SHA-256), so that `tasks/get` and the owner check read it in the record's one HGETALL;
- its bytes: with `MCP_CELERY_ARTIFACTS=redis` a string key beside the record (`Keys.artifact`),
  expiring with it; with an fsspec URL the file `URL/<taskId>/<name>`.

Names are checked once, here, for the worker that writes and the server that reads: a name is a
single path segment of printable characters, so it can never leave the task's folder or key.
URIs are `mcp-celery://tasks/{taskId}/artifacts/{name}`, the name percent-encoded.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from mcp_celery.errors import ArtifactError, ConfigurationError
from mcp_celery.protocol import ARTIFACT_URI_PREFIX, artifact_uri, split_artifact_uri
from mcp_celery.store.schema import ARTIFACT_PREFIX

__all__ = [
    "ARTIFACT_FIELD_PREFIX",
    "MAX_NAME_LENGTH",
    "REDIS",
    "URI_PREFIX",
    "ArtifactMeta",
    "FsspecArtifacts",
    "artifact_uri",
    "check_name",
    "fsspec_store",
    "parse_uri",
]

#: Prefix of the record fields that hold a task's artifacts (`art:<name>`).
ARTIFACT_FIELD_PREFIX = ARTIFACT_PREFIX
#: The longest artifact name.
MAX_NAME_LENGTH = 200
#: `MCP_CELERY_ARTIFACTS` for artifacts kept in the store's Redis.
REDIS = "redis"
#: Every artifact URI starts so; then `{taskId}/artifacts/{name}`.
URI_PREFIX = ARTIFACT_URI_PREFIX
#: How much of a file is read at a time (hashing, streaming).
CHUNK = 1024 * 1024


def check_name(name: object) -> str:
    """`name` when it may name an artifact.

    Raises:
        ArtifactError: not a string, empty, longer than 200 characters, `.` or `..`, with a path
            separator, or with a character that is not printable.
    """
    if not isinstance(name, str) or not name:
        raise ArtifactError(f"an artifact name must be a non-empty string, not {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ArtifactError(f"artifact name {name[:40]!r}... is {len(name)} characters; at most {MAX_NAME_LENGTH}")
    if name in (".", "..") or ".." in name:
        raise ArtifactError(f"artifact name {name!r} may not contain '..'")
    if "/" in name or "\\" in name:
        raise ArtifactError(f"artifact name {name!r} may not contain a path separator ('/' or '\\')")
    if not name.isprintable():
        raise ArtifactError(f"artifact name {name!r} may contain printable characters only")
    return name


def parse_uri(uri: str) -> tuple[str, str] | None:
    """`(task id, name)` of an artifact URI with a good name; None for anything else (made up, hostile)."""
    parts = split_artifact_uri(uri)
    if parts is None:
        return None
    try:
        check_name(parts[1])
    except ArtifactError:
        return None
    return parts


@dataclass(frozen=True)
class ArtifactMeta:
    """What the record says of one artifact."""

    name: str
    size: int
    mime_type: str
    sha256: str

    def to_json(self) -> str:
        return json.dumps({"size": self.size, "mimeType": self.mime_type, "sha256": self.sha256})

    @classmethod
    def from_json(cls, name: str, text: str) -> ArtifactMeta:
        meta = json.loads(text)
        return cls(name, int(meta["size"]), str(meta["mimeType"]), str(meta["sha256"]))

    def link(self, task_id: str) -> dict[str, Any]:
        """The artifact's `resource_link` content block."""
        return {
            "type": "resource_link",
            "uri": artifact_uri(task_id, self.name),
            "name": self.name,
            "mimeType": self.mime_type,
            "size": self.size,
        }

    @property
    def is_text(self) -> bool:
        """Whether `resources/read` answers with `text` (else a base64 `blob`)."""
        kind = self.mime_type.split(";")[0].strip()
        return kind.startswith("text/") or kind in _TEXT_TYPES or kind.endswith(("+json", "+xml"))


_TEXT_TYPES = {"application/json", "application/x-ndjson", "application/jsonl", "application/xml", "application/csv"}
_KNOWN_TYPES = {".jsonl": "application/jsonl", ".ndjson": "application/x-ndjson", ".sarif": "application/sarif+json"}


def mime_type_of(name: str, given: str | None, text: bool) -> str:
    """`given`, else a guess from the name's extension, else text/plain for text and octet-stream for bytes."""
    if given:
        return given
    suffix = Path(name).suffix.lower()
    guessed = _KNOWN_TYPES.get(suffix) or mimetypes.guess_type(name)[0]
    return guessed or ("text/plain" if text else "application/octet-stream")


def digest_of_file(path: Path) -> tuple[int, str]:
    """Size and SHA-256 (hex) of a local file, read a chunk at a time."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


class FsspecArtifacts:
    """Artifacts in an fsspec file system: `<root>/<taskId>/<name>`."""

    def __init__(self, url: str) -> None:
        try:
            fs, root = url_to_fs(url)
        except (ImportError, ValueError) as exc:  # e.g. s3:// without s3fs installed
            raise ConfigurationError(f"MCP_CELERY_ARTIFACTS={url!r}: {exc}") from exc
        self.url = url
        self.fs: fsspec.AbstractFileSystem = fs
        self.root = root.rstrip("/")

    def path(self, task_id: str, name: str) -> str:
        return f"{self.root}/{task_id}/{check_name(name)}"

    def put_bytes(self, task_id: str, name: str, data: bytes) -> None:
        self.fs.makedirs(f"{self.root}/{task_id}", exist_ok=True)
        self.fs.pipe_file(self.path(task_id, name), data)

    def put_file(self, task_id: str, name: str, local: Path) -> None:
        self.fs.makedirs(f"{self.root}/{task_id}", exist_ok=True)
        self.fs.put_file(str(local), self.path(task_id, name))

    def remove(self, task_id: str, name: str) -> None:
        path = self.path(task_id, name)
        if self.fs.exists(path):
            self.fs.rm(path)

    def read(self, task_id: str, name: str, start: int, end: int) -> Generator[bytes, None, None]:
        """The bytes `start` to `end` (exclusive), a chunk at a time."""
        with self.fs.open(self.path(task_id, name), "rb") as file:
            file.seek(start)
            left = end - start
            while left > 0 and (chunk := file.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk

    def task_folders(self) -> list[str]:
        """The task ids that have a folder (the sweep's candidates)."""
        if not self.fs.exists(self.root):
            return []
        return [str(path).rstrip("/").rsplit("/", 1)[-1] for path in self.fs.ls(self.root, detail=False)]

    def remove_task(self, task_id: str) -> None:
        """Remove a task's folder and everything in it; a folder already gone is fine."""
        try:
            self.fs.rm(f"{self.root}/{task_id}", recursive=True)
        except FileNotFoundError:
            pass


def fsspec_store(setting: str) -> FsspecArtifacts | None:
    """The fsspec store `MCP_CELERY_ARTIFACTS` names; None for `redis`."""
    return None if setting == REDIS else FsspecArtifacts(setting)
