"""`JobContext.artifact`: a job's file handed over beside its result (`mcp_celery.store.artifacts`).

Worker tier. The bytes go where `MCP_CELERY_ARTIFACTS` says (the store's Redis, under the task's
quota, or an fsspec file system, `mcp_celery.store.artifact_files`), then the record gets the
artifact's entry; the server lists every entry as a `resource_link` in the task's result and serves
the bytes (`resources/read`, the HTTP download). A name written again replaces the earlier artifact.

A file (`path=`) and a stream (`data=` an iterable of bytes, e.g. a generator) are never read into
memory whole: Redis gets them a few MiB at a time, an fsspec store as a file written as it comes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mcp_celery.errors import ArtifactError
from mcp_celery.store.artifact_files import FsspecArtifacts, fsspec_store
from mcp_celery.store.artifacts import CHUNK, ArtifactMeta, check_name, digest_of_file, mime_type_of, over_quota
from mcp_celery.store.sync import SyncStore

__all__ = ["ArtifactSink"]


@functools.cache
def _fsspec_store(setting: str, prefix: str) -> FsspecArtifacts | None:
    return fsspec_store(setting, prefix)


class ArtifactSink:
    """Where one job's artifacts go: its task, the store named by `setting`, the quota in Redis."""

    def __init__(self, store: SyncStore, task_id: str, setting: str, quota: int) -> None:
        self._store = store
        self._task_id = task_id
        self._files = _fsspec_store(setting, store.keys.prefix)
        self._quota = quota
        #: Whether this run wrote an artifact (its end expires their bytes in Redis with the record).
        self.wrote = False

    def put(
        self, name: str, data: bytes | str | Iterable[bytes] | None, path: str | Path | None, mime_type: str | None
    ) -> dict[str, Any]:
        """Store one artifact and return its `resource_link`.

        Raises:
            ArtifactError: a bad name, neither or both of `data` and `path`, or over the quota in Redis.
        """
        check_name(name)
        if (data is None) == (path is None):
            raise ArtifactError("ctx.artifact() takes the bytes or text as data, or a file's path=, not both")
        if path is not None:
            meta = self._put_file(name, Path(path), mime_type)
        elif isinstance(data, (bytes, bytearray, memoryview, str)):
            meta = self._put_data(name, data, mime_type)
        else:
            assert data is not None
            meta = self._put_stream(name, data, mime_type_of(name, mime_type, False))
        self.wrote = True
        return meta.link(self._task_id)

    def _put_data(self, name: str, data: bytes | bytearray | memoryview | str, mime_type: str | None) -> ArtifactMeta:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        meta = ArtifactMeta(name, len(raw), mime_type_of(name, mime_type, isinstance(data, str)), _sha256(raw))
        if self._files is None:
            self._record(meta, raw)
        else:
            self._files.put_bytes(self._task_id, name, raw)
            self._record(meta, None)
        return meta

    def _put_file(self, name: str, path: Path, mime_type: str | None) -> ArtifactMeta:
        if not path.is_file():
            raise ArtifactError(f"ctx.artifact({name!r}, path={str(path)!r}): no such file")
        if self._files is None:
            if path.stat().st_size > self._quota:  # before sending a byte
                raise over_quota(name, path.stat().st_size, self._quota)
            return self._put_stream(name, _pieces_of(path), mime_type_of(name, mime_type, False))
        size, digest = digest_of_file(path)
        meta = ArtifactMeta(name, size, mime_type_of(name, mime_type, False), digest)
        self._files.put_file(self._task_id, name, path)
        self._record(meta, None)
        return meta

    def _put_stream(self, name: str, pieces: Iterable[bytes], mime_type: str) -> ArtifactMeta:
        if self._files is None:
            size, digest = self._store.stage_artifact(self._task_id, name, pieces, self._quota)
            meta = ArtifactMeta(name, size, mime_type, digest)
            self._store.put_artifact(self._task_id, meta, None, self._quota, staged=True)
        else:
            size, digest = self._files.put_stream(self._task_id, name, pieces)
            meta = ArtifactMeta(name, size, mime_type, digest)
            self._record(meta, None)
        return meta

    def _record(self, meta: ArtifactMeta, data: bytes | None) -> None:
        quota = self._quota if data is not None else None
        if not self._store.put_artifact(self._task_id, meta, data, quota) and self._files is not None:
            self._files.remove(self._task_id, meta.name)  # the task has expired: nothing may stay behind


def _pieces_of(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while piece := file.read(CHUNK):
            yield piece


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
