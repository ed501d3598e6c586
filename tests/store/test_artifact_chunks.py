"""Artifacts in Redis as chunk keys (`mcp_celery.store.sync_artifacts`, `AsyncStore.artifact_bytes`).

A file or a stream handed to `ctx.artifact` is written as keys of CHUNK_BYTES (the last one holds
the rest) whose names carry an id of the write; the record's entry names them, so nothing is found
before the entry is added, and the one-key layout of earlier releases still reads. Each test writes
through the worker's store and reads through the server's, on the store's Redis as the worker and the
server reach it (the ACL user in the ACL pass, a Redis Cluster in the Cluster pass); what is left in
Redis is looked up as an administrator (`store_redis`).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import mcp_celery.store.sync_artifacts as sync_artifacts
from mcp_celery.errors import ArtifactError
from mcp_celery.server.engine.artifacts import Artifact, ArtifactReader
from mcp_celery.store import scripts
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.artifacts import ARTIFACT_FIELD_PREFIX, CHUNK, CHUNK_BYTES, ArtifactMeta
from mcp_celery.store.connect import async_client, redis_target, sync_client
from mcp_celery.store.schema import Keys, Lifetimes
from mcp_celery.store.sync import SyncStore
from tests.support.harness import wait_for

pytestmark = pytest.mark.store

STORE = os.environ.get("MCP_CELERY_REDIS_URL") or os.environ["TEST_RESULT_BACKEND"]
KEYS = Keys()  # the default prefix: the only keys the ACL pass's user may touch
QUOTA = 64 << 20


@pytest.fixture
def store() -> Iterator[SyncStore]:
    client = sync_client(redis_target(STORE), socket_timeout=None)
    yield SyncStore(client, KEYS, Lifetimes(3600, 3600))
    client.close()


def new_task(store: SyncStore, ttl_ms: int = 600_000) -> str:
    """A task record (what creating the task wrote, as far as artifacts care), under a fresh id."""
    task_id = f"chunks-{uuid.uuid4().hex}"
    store.redis.hset(KEYS.task(task_id), mapping={"tool": "log_search", "created": "1"})
    store.redis.pexpire(KEYS.task(task_id), ttl_ms)
    return task_id


def stream(store: SyncStore, task_id: str, data: bytes, name: str = "out.bin", piece: int = 300_001) -> ArtifactMeta:
    """`data` streamed in pieces of an odd size (chunks never line up with them), as `ctx.artifact(data=...)` does."""
    pieces = (data[at : at + piece] for at in range(0, len(data), piece))
    meta = store.stage_artifact(task_id, name, "application/octet-stream", pieces, QUOTA)
    assert store.put_artifact(task_id, meta, None, QUOTA, staged=True)
    return meta


def read(task_id: str, meta: ArtifactMeta, start: int = 0, end: int | None = None) -> bytes | None:
    """Bytes `start` to `end` as the server reads them: `AsyncStore.artifact_bytes` in one call, and the
    download's reader (`ArtifactReader.chunks`, a MiB at a time) too, which must agree; None when gone."""

    async def both() -> bytes | None:
        client = async_client(redis_target(STORE))
        try:
            store = AsyncStore(client, KEYS, Lifetimes(3600, 3600))
            stop = meta.size if end is None else end
            whole = await store.artifact_bytes(task_id, meta, start, stop)
            try:
                chunked = b"".join(
                    [c async for c in ArtifactReader(store, None).chunks(Artifact(task_id, meta), start, stop)]
                )
            except FileNotFoundError:
                chunked = None
            assert chunked == whole
            return whole
        finally:
            await client.aclose()

    return anyio.run(both)


def chunk_keys(admin: Any, task_id: str) -> list[bytes]:
    """Every chunk key of the task in Redis, whatever write made it."""
    return sorted(admin.scan_iter(match=f"{KEYS.task(task_id)}:artifact-chunk:*", count=1000))


def entry(store: SyncStore, task_id: str, name: str = "out.bin") -> ArtifactMeta:
    raw = store.redis.hget(KEYS.task(task_id), ARTIFACT_FIELD_PREFIX + name)
    assert isinstance(raw, bytes)
    return ArtifactMeta.from_json(name, raw.decode())


def test_a_range_across_a_chunk_boundary_reads_from_both_chunks(store: SyncStore, store_redis: Any) -> None:
    data = os.urandom(2 * CHUNK_BYTES + CHUNK_BYTES // 2 + 7)
    task_id = new_task(store)
    meta = stream(store, task_id, data)
    assert entry(store, task_id) == meta and meta.sha256 == hashlib.sha256(data).hexdigest()
    assert meta.chunk_bytes == CHUNK_BYTES and len(chunk_keys(store_redis, task_id)) == 3
    boundary = CHUNK_BYTES
    for start, end in [(boundary - 10, boundary + 10), (boundary - 1, boundary + 1), (1, 2 * boundary + 5)]:
        assert read(task_id, meta, start, end) == data[start:end], (start, end)
    # A download from an offset that is no multiple of a MiB: every MiB it reads spans two keys at a boundary.
    assert read(task_id, meta, CHUNK // 3) == data[CHUNK // 3 :]
    assert read(task_id, meta) == data


def test_an_artifact_of_exactly_n_chunks_has_n_full_keys_and_an_empty_one_none(
    store: SyncStore, store_redis: Any
) -> None:
    data = os.urandom(2 * CHUNK_BYTES)
    task_id = new_task(store)
    meta = stream(store, task_id, data, piece=CHUNK_BYTES)  # pieces that line up with the chunks too
    keys = meta.redis_keys(KEYS, task_id)
    assert [k.encode() for k in keys] == chunk_keys(store_redis, task_id) and len(keys) == 2
    assert [store_redis.strlen(k) for k in keys] == [CHUNK_BYTES, CHUNK_BYTES]
    assert read(task_id, meta, len(data) - 1) == data[-1:] and read(task_id, meta) == data
    empty = stream(store, task_id, b"", name="empty.txt")
    assert empty.size == 0 and empty.redis_keys(KEYS, task_id) == [] and read(task_id, empty) == b""
    assert len(chunk_keys(store_redis, task_id)) == 2


def test_an_artifact_in_one_key_as_earlier_releases_wrote_it_still_reads_and_is_replaced_whole(
    store: SyncStore, store_redis: Any
) -> None:
    data = os.urandom(CHUNK_BYTES + 100)
    task_id = new_task(store)
    old = json.dumps({"size": len(data), "mimeType": "application/octet-stream", "sha256": "0" * 64})
    store.redis.set(KEYS.artifact(task_id, "out.bin"), data)  # what staging, then RENAME, left
    store.redis.hset(KEYS.task(task_id), ARTIFACT_FIELD_PREFIX + "out.bin", old)
    meta = entry(store, task_id)
    assert meta.chunk_bytes == 0 and meta.redis_keys(KEYS, task_id) == [KEYS.artifact(task_id, "out.bin")]
    assert read(task_id, meta, CHUNK_BYTES - 3, CHUNK_BYTES + 3) == data[CHUNK_BYTES - 3 : CHUNK_BYTES + 3]
    assert read(task_id, meta) == data
    store.expire_artifacts(task_id)  # the job's end gives the one key the record's lifetime too
    assert 0 < store_redis.pttl(KEYS.artifact(task_id, "out.bin")) <= store_redis.pttl(KEYS.task(task_id)) + 1000
    newer = stream(store, task_id, data[::-1])  # written again under its name: chunks now, the one key gone
    assert not store_redis.exists(KEYS.artifact(task_id, "out.bin")) and read(task_id, newer) == data[::-1]
    again = stream(store, task_id, data)  # and again: the first write's chunks go
    assert [k.encode() for k in again.redis_keys(KEYS, task_id)] == chunk_keys(store_redis, task_id)
    assert read(task_id, meta) is None  # a reader of the replaced artifact finds it gone, never mixed bytes


def test_a_write_refused_or_failed_leaves_no_chunk_behind(store: SyncStore, store_redis: Any) -> None:
    data = os.urandom(3 * CHUNK_BYTES)
    task_id = new_task(store)

    def written_then(last: Iterator[bytes]) -> Iterator[bytes]:
        """Two chunks, then (once they are in Redis) what `last` gives."""
        before = len(chunk_keys(store_redis, task_id))
        yield data[: 2 * CHUNK_BYTES]
        wait_for(lambda: len(chunk_keys(store_redis, task_id)) == before + 2, 10, 0.01, "two chunks written")
        yield from last

    quota = 2 * CHUNK_BYTES
    with pytest.raises(ArtifactError, match=f"MCP_CELERY_ARTIFACT_MAX_BYTES={quota:,}"):  # one byte over, alone
        store.stage_artifact(task_id, "big.bin", "application/octet-stream", written_then(iter([b"x"])), quota)
    assert chunk_keys(store_redis, task_id) == []
    stream(store, task_id, data[: CHUNK_BYTES * 2], name="first.bin")  # 2 chunks' worth of the quota taken
    meta = store.stage_artifact(task_id, "second.bin", "application/octet-stream", [data], QUOTA)
    assert len(chunk_keys(store_redis, task_id)) == 2 + 3
    with pytest.raises(ArtifactError, match=f"to {5 * CHUNK_BYTES:,} bytes"):  # with the first one: over 16 MiB
        store.put_artifact(task_id, meta, None, 16 << 20, staged=True)
    assert len(chunk_keys(store_redis, task_id)) == 2 and read(task_id, meta) is None

    def failing() -> Iterator[bytes]:
        raise RuntimeError("the job failed")
        yield b""  # a generator

    with pytest.raises(RuntimeError, match="the job failed"):  # two chunks written, then the job's generator fails
        store.stage_artifact(task_id, "third.bin", "application/octet-stream", written_then(failing()), QUOTA)
    assert len(chunk_keys(store_redis, task_id)) == 2
    gone = new_task(store)
    meta = store.stage_artifact(gone, "late.bin", "application/octet-stream", [data], QUOTA)
    store.redis.delete(KEYS.task(gone))  # the task expired while the job wrote
    assert store.put_artifact(gone, meta, None, QUOTA, staged=True) is False
    assert chunk_keys(store_redis, gone) == []


def test_every_chunk_expires_with_the_record(store: SyncStore, store_redis: Any) -> None:
    data = os.urandom(2 * CHUNK_BYTES + 1)
    task_id = new_task(store, ttl_ms=600_000)
    meta = stream(store, task_id, data)
    keys = meta.redis_keys(KEYS, task_id)
    assert len(keys) == 3 and all(0 < store_redis.pttl(k) <= store_redis.pttl(KEYS.task(task_id)) + 1000 for k in keys)
    store.redis.persist(KEYS.task(task_id))  # kept for ever (a TTL of none): the chunks too
    store.expire_artifacts(task_id)
    assert [store_redis.pttl(k) for k in keys] == [-1, -1, -1]
    store.redis.pexpire(KEYS.task(task_id), 300)  # the job's end: a short TTL, then its caller
    store.expire_artifacts(task_id)
    wait_for(lambda: store_redis.exists(KEYS.task(task_id), *keys) == 0, 10, 0.02, "Redis to expire every key")


def test_a_put_whose_entry_changed_since_it_was_read_does_nothing(store: SyncStore, store_redis: Any) -> None:
    """The script's answer when another write of the name came between the caller's read and the script:
    nothing written, nothing deleted (the caller reads the entry again and retries)."""
    task_id = new_task(store)
    first = stream(store, task_id, b"first")
    staged = store.stage_artifact(task_id, "out.bin", "text/plain", [b"second"], QUOTA)
    put = store.redis.register_script(scripts.ARTIFACT_PUT)
    new, old = staged.redis_keys(KEYS, task_id), first.redis_keys(KEYS, task_id)
    args = ["out.bin", staged.to_json(), staged.size, QUOTA, len(new), '{"size": 1}']  # not what the record holds
    assert put(keys=[KEYS.task(task_id), *new, *old], args=args) == [-2, 0]
    assert entry(store, task_id) == first and store_redis.exists(*old, *new) == 2
    assert store.put_artifact(task_id, staged, None, QUOTA, staged=True)
    assert entry(store, task_id) == staged and store_redis.exists(*old) == 0 and read(task_id, staged) == b"second"


def test_a_slow_stream_keeps_its_first_chunks_alive_until_the_last(
    store: SyncStore, store_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks expire (STAGING_TTL_MS) unless the write renews them: a write that outlasts the TTL loses none."""
    ttl_ms = 3000
    monkeypatch.setattr(sync_artifacts, "STAGING_TTL_MS", ttl_ms)
    data = os.urandom(2 * CHUNK_BYTES + 10)
    task_id = new_task(store)
    second = None

    def aged(key: Any) -> bool:  # written, and more than 60% of the TTL gone
        return 0 < store_redis.pttl(key) < ttl_ms * 0.4

    def slowly() -> Iterator[bytes]:
        nonlocal second
        yield data[:CHUNK_BYTES]
        (zero,) = wait_for(lambda: chunk_keys(store_redis, task_id), 10, 0.01, "the first chunk")
        wait_for(lambda: aged(zero), 10, 0.01, "the first chunk to age")
        yield data[CHUNK_BYTES : 2 * CHUNK_BYTES]  # its write renews the first chunk
        second = wait_for(lambda: next(iter(chunk_keys(store_redis, task_id)[1:]), None), 10, 0.01, "the second")
        wait_for(lambda: aged(second), 10, 0.01, "the second chunk to age")  # the first's TTL ran out by now
        assert store_redis.exists(zero), "the first chunk expired while the stream went on"
        yield data[2 * CHUNK_BYTES :]

    meta = store.stage_artifact(task_id, "slow.bin", "application/octet-stream", slowly(), QUOTA)
    assert store.put_artifact(task_id, meta, None, QUOTA, staged=True) and second is not None
    assert read(task_id, meta) == data
