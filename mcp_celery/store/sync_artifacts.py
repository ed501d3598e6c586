"""The worker's store for artifacts (`mcp_celery.store.artifacts`): the record's entry, and the bytes in Redis.

Tier 1, a part of `SyncStore`. One script (`scripts.ARTIFACT_PUT`) checks the task's quota, stores
the bytes (when Redis keeps them) and adds the artifact to the record, so a reader never finds an
entry without its bytes; a task whose record has expired gets nothing written.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import Script

from mcp_celery.errors import ArtifactError
from mcp_celery.store import scripts
from mcp_celery.store.artifacts import ArtifactMeta
from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.schema import ARTIFACT_PREFIX, Keys, as_text

__all__ = ["ArtifactWrites"]


class ArtifactWrites:
    """The artifact methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys
    _artifact_put: Script | None = None

    def put_artifact(self, task_id: str, meta: ArtifactMeta, data: bytes | None, quota: int | None) -> bool:
        """Add `meta` to the task's record and, with `data`, keep the bytes in Redis (under `quota` bytes
        of artifacts per task). False: the record is gone (the task expired): nothing was written.

        Raises:
            ArtifactError: the task's artifacts in Redis would exceed `quota` bytes.
        """
        if self._artifact_put is None:
            self._artifact_put = self.redis.register_script(scripts.ARTIFACT_PUT)
        keys = [self.keys.task(task_id)]
        args: list[Any] = [meta.name, meta.to_json(), meta.size, "" if quota is None else quota]
        if data is not None:
            keys.append(self.keys.artifact(task_id, meta.name))
            args.append(data)
        stored, used = self._artifact_put(keys=keys, args=args)
        if int(stored) == 0:
            raise ArtifactError(
                f"artifact {meta.name!r} ({meta.size:,} bytes) would take the task's artifacts in Redis to "
                f"{int(used) + meta.size:,} bytes, over MCP_CELERY_ARTIFACT_MAX_BYTES={quota:,}; raise it, or "
                "keep artifacts in a file system or object store (MCP_CELERY_ARTIFACTS=file:///... or s3://...)"
            )
        return int(stored) == 1

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
