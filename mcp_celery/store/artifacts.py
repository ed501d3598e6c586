"""Artifacts: the files a job hands over beside its result, their names, URIs and where their bytes live.

Tier 1, pure (neither Redis nor fsspec). A task's artifact `report.csv` is

- a field `art:report.csv` of the task's record, holding its `ArtifactMeta` (JSON: size, MIME type,
  SHA-256), so that `tasks/get` and the owner check read it in the record's one HGETALL;
- its bytes: with `MCP_CELERY_ARTIFACTS=redis` a string key beside the record (`Keys.artifact`),
  expiring with it; with an fsspec URL the file `URL/<key prefix>/<taskId>/<name>`
  (`mcp_celery.store.artifact_files`).

Names are checked once, here, for the worker that writes and the server that reads: a name is a
single path segment of printable characters, so it can never leave the task's folder or key.
URIs are `mcp-celery://tasks/{taskId}/artifacts/{name}`, the name percent-encoded.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_celery.errors import ArtifactError
from mcp_celery.protocol import ARTIFACT_URI_PREFIX, artifact_uri, split_artifact_uri
from mcp_celery.store.schema import ARTIFACT_PREFIX

__all__ = [
    "ARTIFACT_FIELD_PREFIX",
    "MAX_NAME_LENGTH",
    "REDIS",
    "URI_PREFIX",
    "ArtifactMeta",
    "artifact_uri",
    "check_name",
    "over_quota",
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


def over_quota(name: str, total: int, quota: int) -> ArtifactError:
    """The error of an artifact that would take the task's artifacts in Redis to `total` bytes, past `quota`."""
    return ArtifactError(
        f"artifact {name!r} would take the task's artifacts in Redis to {total:,} bytes, over "
        f"MCP_CELERY_ARTIFACT_MAX_BYTES={quota:,}; raise it, or keep artifacts in a file system or object "
        "store (MCP_CELERY_ARTIFACTS=file:///... or s3://...)"
    )


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
