"""The worker's store for artifacts (`mcp_celery.store.artifacts`): the record's entry, and the bytes in Redis.

Tier 1, a part of `SyncStore`. One script (`scripts.ARTIFACT_PUT`) checks the task's quota, stores
the bytes (when Redis keeps them) and adds the artifact to the record, so a reader never finds an
entry without its bytes; a task whose record has expired gets nothing written.

Bytes that come as a stream (a file, or a job's generator) are appended to a staging key a piece at
a time (`stage_artifact`), so that the worker holds one piece, not the artifact; the script then
renames the staging key into place with the record's entry, in the same step as above.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
from collections.abc import Iterable
from typing import Any

from redis.commands.core import Script
from redis.exceptions import RedisError

from mcp_celery.store import scripts
from mcp_celery.store.artifacts import ArtifactMeta, over_quota
from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.schema import ARTIFACT_PREFIX, Keys, as_text

__all__ = ["ArtifactWrites"]

#: How many bytes of a streamed artifact go to Redis in one round trip (pieces appended in a pipeline).
PIECES_BYTES = 2 << 20
#: A staging key outlives a worker that died while streaming by this much (each round trip renews it).
STAGING_TTL_MS = 3_600_000


class ArtifactWrites:
    """The artifact methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys
    _artifact_put: Script | None = None

    def put_artifact(
        self, task_id: str, meta: ArtifactMeta, data: bytes | None, quota: int | None, *, staged: bool = False
    ) -> bool:
        """Add `meta` to the task's record and, with `data` (or `staged`: the bytes `stage_artifact` wrote),
        keep the bytes in Redis (under `quota` bytes of artifacts per task). False: the record is gone (the
        task expired): nothing was written, and the staged bytes are deleted.

        Raises:
            ArtifactError: the task's artifacts in Redis would exceed `quota` bytes.
        """
        if self._artifact_put is None:
            self._artifact_put = self.redis.register_script(scripts.ARTIFACT_PUT)
        keys = [self.keys.task(task_id)]
        args: list[Any] = [meta.name, meta.to_json(), meta.size, "" if quota is None else quota]
        if staged:
            keys += [self.keys.artifact(task_id, meta.name), self.keys.artifact_staging(task_id, meta.name)]
        elif data is not None:
            keys.append(self.keys.artifact(task_id, meta.name))
            args.append(data)
        stored, used = self._artifact_put(keys=keys, args=args)
        if int(stored) == 0:
            assert quota is not None
            raise over_quota(meta.name, int(used) + meta.size, quota)
        return int(stored) == 1

    def stage_artifact(self, task_id: str, name: str, pieces: Iterable[bytes], quota: int) -> tuple[int, str]:
        """Append `pieces` to the artifact's staging key as they come, a few MiB per round trip; their size
        and SHA-256. `put_artifact(..., staged=True)` then moves them into place. Whatever stops it (over
        `quota` bytes, Redis, or `pieces` raising) deletes the staging key.

        A thread of its own hashes and sends, so that making the next pieces (the caller's iterable, on
        this thread) overlaps them; at most two batches wait for it.

        Raises:
            ArtifactError: the artifact alone is over `quota` bytes.
        """
        key = self.keys.artifact_staging(task_id, name)
        self.redis.delete(key)  # what an earlier run of this job left behind
        sender = _Sender(self.redis, key)
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
                    sender.send(batch)
                    batch, batched = [], 0
            sender.send(batch)
            digest = sender.finish()
        except BaseException:
            sender.abandon()
            with contextlib.suppress(RedisError):  # Redis is what failed: the key expires (STAGING_TTL_MS)
                self.redis.delete(key)
            raise
        return size, digest

    def expire_artifacts(self, task_id: str, *, output: bool = False) -> None:
        """Give the bytes of the task's artifacts in Redis, and with `output` its live output, the record's
        lifetime now (after the job's end set it)."""
        record_key = self.keys.task(task_id)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.pttl(record_key)
            pipe.hkeys(record_key)
            ttl_ms, fields = pipe.execute()
        names = [as_text(f)[len(ARTIFACT_PREFIX) :] for f in fields if as_text(f).startswith(ARTIFACT_PREFIX)]
        keys = [self.keys.artifact(task_id, name) for name in names] + ([self.keys.output(task_id)] if output else [])
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


class _Sender:
    """Hashes batches of pieces and appends them to a staging key, on a thread of its own."""

    def __init__(self, client: SyncRedis, key: str) -> None:
        self.client, self.key = client, key
        self.digest = hashlib.sha256()
        self.error: BaseException | None = None
        self._batches: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._run, name="artifact-sender", daemon=True)
        self._thread.start()

    def send(self, batch: list[bytes]) -> None:
        """Queue `batch` (waits while two are queued).

        Raises:
            BaseException: what sending an earlier batch raised.
        """
        if self.error is not None:
            raise self.error
        if batch:
            self._batches.put(batch)

    def finish(self) -> str:
        """Wait until every batch is sent; the SHA-256 (hex) of them all.

        Raises:
            BaseException: what sending a batch raised.
        """
        self._batches.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digest.hexdigest()

    def abandon(self) -> None:
        """Stop sending (the caller failed): the queued batches are dropped, the thread ends."""
        self.error = self.error or RuntimeError("abandoned")
        with contextlib.suppress(queue.Empty):
            while True:
                self._batches.get_nowait()
        self._batches.put(None)  # room enough: the queue was just emptied, and only this thread puts
        self._thread.join()

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            if self.error is not None:
                continue
            try:
                with self.client.pipeline(transaction=False) as pipe:
                    for piece in batch:
                        self.digest.update(piece)
                        pipe.append(self.key, piece)
                    pipe.pexpire(self.key, STAGING_TTL_MS)
                    pipe.execute()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which raises it
                self.error = exc
