"""A task's artifacts as the server serves them: found through the task service's owner check, then read.

Server tier, beside the service. `TaskService.find_artifact` does the lookup (the owner check of
`tasks/get`: unknown, expired and foreign tasks, and names the record does not list, all give
None); this module reads the bytes where `MCP_CELERY_ARTIFACTS` keeps them, a chunk at a time, and
sweeps the fsspec folders whose task has expired. `resources/read` and the HTTP download are thin
surfaces over both.

Redis expires an artifact's bytes with its record. A file system or object store does not expire
anything: every server process looks every `MCP_CELERY_ARTIFACT_SWEEP_S` for task folders whose
record is gone and removes them, so a file outlives its task by at most that period (plus the time
no server runs). It looks in the deployment's folder only, and removes only the folders mcp-celery
marked as it wrote them (`mcp_celery.store.artifact_files`): whatever else is there stays. Two
servers sweeping at once remove the same folder twice, harmlessly.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.artifact_files import FsspecArtifacts
from mcp_celery.store.artifacts import CHUNK, ArtifactMeta

__all__ = ["Artifact", "ArtifactReader"]

logger = logging.getLogger(__name__)

#: Folders whose records are checked in one round trip.
_SWEEP_BATCH = 500


@dataclass(frozen=True)
class Artifact:
    """An artifact a caller may read: its task and what the record says of it."""

    task_id: str
    meta: ArtifactMeta


class ArtifactReader:
    """Reads artifacts from the store's Redis (`files` None) or an fsspec file system."""

    def __init__(self, store: AsyncStore, files: FsspecArtifacts | None) -> None:
        self.store = store
        self.files = files

    async def chunks(self, artifact: Artifact, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` (exclusive; default: the end), a chunk at a time.

        Raises:
            FileNotFoundError: the bytes are gone (the task expired while they were read).
        """
        end = artifact.meta.size if end is None else end
        if self.files is None:
            for at in range(start, end, CHUNK):
                data = await self.store.artifact_bytes(artifact.task_id, artifact.meta.name, at, min(at + CHUNK, end))
                if data is None:
                    raise FileNotFoundError(artifact.meta.name)
                yield data
            return
        files = self.files
        reading = files.read(artifact.task_id, artifact.meta.name, start, end)
        try:
            while chunk := await anyio.to_thread.run_sync(next, reading, b""):
                yield chunk
        finally:
            reading.close()  # the file, when the reader stops early

    async def read_all(self, artifact: Artifact) -> bytes:
        """The whole artifact (`resources/read`, which checks its size first)."""
        return b"".join([chunk async for chunk in self.chunks(artifact)])

    async def sweep_every(self, period_s: float) -> None:
        """`sweep` every `period_s` for as long as the server runs (fsspec stores only)."""
        while self.files is not None:
            await anyio.sleep(period_s)
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - a failed sweep (Redis, the file system) is tried again next period
                logger.warning("could not sweep expired artifacts; trying again in %.0f s", period_s, exc_info=True)

    async def sweep(self) -> int:
        """Remove the fsspec folders that mcp-celery wrote for tasks whose record has expired; the number removed."""
        if self.files is None:
            return 0
        files = self.files
        folders = await anyio.to_thread.run_sync(files.task_folders)
        removed = 0
        for first in range(0, len(folders), _SWEEP_BATCH):
            batch = folders[first : first + _SWEEP_BATCH]
            for task_id, exists in zip(batch, await self.store.records_exist(batch), strict=True):
                if not exists and await anyio.to_thread.run_sync(files.remove_task, task_id):
                    removed += 1
        if removed:
            logger.info("removed the artifacts of %d expired task(s) from %s", removed, files.url)
        return removed
