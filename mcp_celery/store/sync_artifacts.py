"""The worker's store for artifacts (`mcp_celery.store.artifacts`): the record's entry, and the bytes in Redis.

Tier 1, a part of `SyncStore`. One script (`scripts.ARTIFACT_PUT`) checks the task's quota, stores
the bytes (when Redis keeps them) and adds the artifact to the record, so a reader never finds an
entry without its bytes; a task whose record has expired gets nothing written.

Bytes that come as a stream (a file, or a job's generator) are written as they come into chunk keys
of CHUNK_BYTES (`stage_artifact`), so that the worker holds a chunk, not the artifact. The keys'
names carry an id new to this write, and no entry names them until the script adds it with the
record's entry, in the same step as above: until then no reader finds them, and whatever stops the
write (the quota, Redis, the job) deletes them. Chunks left by a worker that died while streaming
expire (STAGING_TTL_MS).
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from redis.commands.core import Script
from redis.exceptions import RedisError

from mcp_celery.store import scripts
from mcp_celery.store.artifacts import CHUNK_BYTES, ArtifactMeta, over_quota
from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.schema import ARTIFACT_PREFIX, Keys, as_text

__all__ = ["ArtifactWrites"]

#: How many bytes of a stream the job's thread hands to the writing thread at once (less held in the
#: queue keeps the worker's peak memory down: 2 MiB cost it about 8 MiB more, for no gain in speed).
PIECES_BYTES = 512 << 10
#: Chunks outlive a worker that died while streaming by this much (the writer renews the earlier
#: chunks' lifetimes while it writes, so a slow stream keeps them all).
STAGING_TTL_MS = 3_600_000
#: The write's ARTIFACT_PUT answer when the entry it replaces changed since it was read: read it again.
_CHANGED = -2


class ArtifactWrites:
    """The artifact methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys
    _artifact_put: Script | None = None

    def put_artifact(
        self, task_id: str, meta: ArtifactMeta, data: bytes | None, quota: int | None, *, staged: bool = False
    ) -> bool:
        """Add `meta` to the task's record and, with `data` (or `staged`: the chunks `stage_artifact` wrote),
        keep the bytes in Redis (under `quota` bytes of artifacts per task). An artifact of the same name
        is replaced, its bytes deleted. False: the record is gone (the task expired): nothing was written,
        and the staged chunks are deleted.

        Raises:
            ArtifactError: the task's artifacts in Redis would exceed `quota` bytes (the staged chunks are
                deleted).
        """
        if self._artifact_put is None:
            self._artifact_put = self.redis.register_script(scripts.ARTIFACT_PUT)
        record = self.keys.task(task_id)
        new = meta.redis_keys(self.keys, task_id) if staged or data is not None else []
        args: list[Any] = [meta.name, meta.to_json(), meta.size, "" if quota is None else quota, len(new)]
        while True:  # again only when another write of the name came between the read and the script
            entry = self.redis.hget(record, ARTIFACT_PREFIX + meta.name)
            replaced = [] if entry is None else self._keys_of(task_id, meta.name, entry)
            stored, used = self._artifact_put(
                keys=[record, *new, *replaced], args=[*args, entry or "", *([] if data is None else [data])]
            )
            if int(stored) != _CHANGED:
                break
        if int(stored) == 0:
            assert quota is not None
            raise over_quota(meta.name, int(used) + meta.size, quota)
        return int(stored) == 1

    def _keys_of(self, task_id: str, name: str, entry: bytes | str) -> list[str]:
        """The Redis keys of the artifact a record's entry describes."""
        return ArtifactMeta.from_json(name, as_text(entry)).redis_keys(self.keys, task_id)

    def stage_artifact(
        self, task_id: str, name: str, mime_type: str, pieces: Iterable[bytes], quota: int
    ) -> ArtifactMeta:
        """Write `pieces` into chunk keys as they come; the artifact's meta (size, SHA-256, chunks).
        `put_artifact(..., staged=True)` then makes it visible. Whatever stops it (over `quota` bytes,
        Redis, or `pieces` raising) deletes the chunks written.

        A thread of its own hashes and writes, so that making the next pieces (the caller's iterable, on
        this thread) overlaps them; at most two batches wait for it.

        Raises:
            ArtifactError: the artifact alone is over `quota` bytes.
        """
        chunk_id = uuid.uuid4().hex
        writer = _ChunkWriter(self.redis, lambda index: self.keys.artifact_chunk(task_id, chunk_id, index))
        size = batched = 0
        batch: list[bytes] = []
        try:
            for piece in pieces:
                size += len(piece)
                if size > quota:
                    raise over_quota(name, size, quota)
                batch.append(piece)
                batched += len(piece)
                if batched >= PIECES_BYTES:
                    writer.send(batch)
                    batch, batched = [], 0
            writer.send(batch)
            digest = writer.finish()
        except BaseException:
            writer.abandon()
            with contextlib.suppress(RedisError):  # Redis is what failed: the chunks expire (STAGING_TTL_MS)
                if writer.started:
                    self.redis.delete(*writer.started)
            raise
        return ArtifactMeta(name, size, mime_type, digest, CHUNK_BYTES, chunk_id)

    def expire_artifacts(self, task_id: str, *, output: bool = False) -> None:
        """Give the bytes of the task's artifacts in Redis, and with `output` its live output, the record's
        lifetime now (after the job's end set it)."""
        record_key = self.keys.task(task_id)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.pttl(record_key)
            pipe.hgetall(record_key)
            ttl_ms, fields = pipe.execute()
        keys = [self.keys.output(task_id)] if output else []
        for field, entry in fields.items():
            if (name := as_text(field)).startswith(ARTIFACT_PREFIX):
                keys += self._keys_of(task_id, name[len(ARTIFACT_PREFIX) :], entry)
        if not keys:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                if ttl_ms > 0:
                    pipe.pexpire(key, ttl_ms)
                elif ttl_ms == -1:
                    pipe.persist(key)
                else:
                    pipe.delete(key)
            pipe.execute()


class _ChunkWriter:
    """Hashes batches of pieces and writes them as keys of CHUNK_BYTES (`key_of(index)`), on a thread of its own."""

    def __init__(self, client: SyncRedis, key_of: Callable[[int], str]) -> None:
        self.client, self.key_of = client, key_of
        self.digest = hashlib.sha256()
        self.error: BaseException | None = None
        #: The chunk keys written or being written (what a failed write deletes).
        self.started: list[str] = []
        # The next chunk, filled as pieces come, and sent from here as a memoryview, which redis-py writes
        # to the socket as it is: no allocation of a chunk's size per chunk (a copy, and page faults).
        self._chunk = bytearray(CHUNK_BYTES)
        self._filled = 0
        self._renewed = time.monotonic()
        self._batches: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._run, name="artifact-writer", daemon=True)
        self._thread.start()

    def send(self, batch: list[bytes]) -> None:
        """Queue `batch` (waits while two are queued).

        Raises:
            BaseException: what writing an earlier batch raised.
        """
        if self.error is not None:
            raise self.error
        if batch:
            self._batches.put(batch)

    def finish(self) -> str:
        """Wait until every batch is written, the last chunk too; the SHA-256 (hex) of them all.

        Raises:
            BaseException: what writing a batch raised.
        """
        self._batches.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digest.hexdigest()

    def abandon(self) -> None:
        """Stop writing (the caller failed): the queued batches are dropped, the thread ends."""
        self.error = self.error or RuntimeError("abandoned")
        with contextlib.suppress(queue.Empty):
            while True:
                self._batches.get_nowait()
        self._batches.put(None)  # room enough: the queue was just emptied, and only this thread puts
        self._thread.join()

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            if self.error is None:
                self._guarded(self._take, batch)
        if self.error is None and self._filled:
            self._guarded(self._write, memoryview(self._chunk)[: self._filled])

    def _guarded(self, step: Callable[[Any], None], arg: Any) -> None:
        try:
            step(arg)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which raises it
            self.error = exc

    def _take(self, batch: list[bytes]) -> None:
        for piece in batch:
            self.digest.update(piece)
            rest = memoryview(piece)
            while rest:
                part = rest[: CHUNK_BYTES - self._filled]
                self._chunk[self._filled : self._filled + len(part)] = part
                self._filled += len(part)
                rest = rest[len(part) :]
                if self._filled == CHUNK_BYTES:
                    self._write(memoryview(self._chunk))
                    self._filled = 0

    def _write(self, chunk: memoryview) -> None:
        key = self.key_of(len(self.started))
        self.started.append(key)
        self.client.set(key, chunk, px=STAGING_TTL_MS)
        if time.monotonic() - self._renewed > STAGING_TTL_MS / 2000:  # a slow stream: the first chunks stay
            with self.client.pipeline(transaction=False) as pipe:
                for earlier in self.started:
                    pipe.pexpire(earlier, STAGING_TTL_MS)
                pipe.execute()
            self._renewed = time.monotonic()
