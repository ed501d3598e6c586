"""The worker's store against real Redis: its blocking waits always end; a job's start keeps its record alive."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from mcp_celery.protocol import now_ms
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.connect import async_client, redis_target
from mcp_celery.store.replication import NotOnPrimary
from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, Durability, Keys, Lifetimes, TaskRecord
from mcp_celery.store.sync import AnswerWait, SyncStore
from mcp_celery.testing.processes import start_redis, wait_for
from mcp_celery.worker.heartbeat import ANNOUNCE_AFTER_S, Heartbeat, TakenBeat
from tests.support.redis_topologies import start_plain


def test_waits_shorter_than_redis_can_time_never_block_for_ever(store_redis: redis.Redis) -> None:
    """Redis truncates a BLPOP timeout to whole milliseconds and blocks for ever on 0 (0.001 s did so on 6.2)."""
    client = redis.Redis(connection_pool=store_redis.connection_pool)
    store = SyncStore(client, Keys("store-test"), Lifetimes(60, 60))
    for seconds in (0.0, 0.0004, 0.001, 0.0015, 0.009, 0.0101, 0.05):
        started = time.monotonic()
        assert store.sleep_unless_cancelled("no-such-task", seconds) is False
        assert time.monotonic() - started < 1.0, seconds


def stored(store: SyncStore, task_id: str, created_ms: int) -> str:
    """A task record as the server writes it at creation, with its creation lifetime."""
    key = store.keys.task(task_id)
    record = TaskRecord(task_id=task_id, tool="t", created_ms=created_ms, ttl_ms=store.lifetimes.ttl_ms, poll_ms=100)
    store.redis.hset(key, mapping=record.to_hash())  # type: ignore[arg-type]
    store.redis.expire(key, store.lifetimes.live_s)
    return key


def test_a_job_that_starts_soon_keeps_its_records_lifetime_and_one_that_waited_long_gets_a_new_one(
    store_redis: redis.Redis,
) -> None:
    """JOB_START renews the record's lifetime only when the one from its creation might not outlive the job."""
    client = redis.Redis(connection_pool=store_redis.connection_pool)
    store = SyncStore(client, Keys(f"store-test-{uuid.uuid4()}"), Lifetimes(ttl_s=3600, max_job_s=7200))
    fresh = stored(store, "fresh", now_ms())
    client.expire(fresh, store.lifetimes.live_s - 100)  # as if 100 s went by since its creation
    assert store.job_started("fresh", 30_000) is not None
    assert client.ttl(fresh) <= store.lifetimes.live_s - 100  # left as it was: it outlives the job

    # Queued for all but 20 s of the 60-minute TTL: what is left of its lifetime is the longest job and
    # 20 s, within the minute's margin, so it is renewed; 3,500 s (100 s left over) would not be.
    waited = stored(store, "waited", now_ms() - 3_580_000)
    client.expire(waited, store.lifetimes.live_s - 3_580)
    assert store.job_started("waited", 30_000) is not None
    assert client.ttl(waited) > store.lifetimes.live_s - 10  # renewed: the whole job and the TTL ahead again

    longer = stored(store, "longer", now_ms())  # a tool whose own time limit exceeds the longest job
    assert store.job_started("longer", 30_000, store.lifetimes.live_for(10 * 86400)) is not None
    assert client.ttl(longer) > store.lifetimes.live_s


def test_listeners_hear_of_a_jobs_start_a_moment_later_and_not_at_all_when_it_ended_by_then(
    store_redis: redis.Redis,
) -> None:
    """JOB_START does not publish: the job's heartbeat thread tells the task's channel `started`
    ANNOUNCE_AFTER_S later if the job still runs; a job that ended sooner is heard of by its outcome."""
    client = redis.Redis(connection_pool=store_redis.connection_pool)
    store = SyncStore(client, Keys(f"store-test-{uuid.uuid4()}"), Lifetimes(60, 60))
    beat = Heartbeat(store, timeout_s=60)  # its own beats are 20 s apart: only the announcement wakes it
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events("long"), store.keys.events("short"), store.keys.events("parent"))
    try:
        assert pubsub.get_message(timeout=0.1) is None
        started = time.monotonic()
        beat.add("long", "t", now_ms(), "long")
        beat.add("short", "t", now_ms(), "short")
        beat.add("member", "t", now_ms(), "parent")  # a workflow member: its task's listeners hear of it
        beat.discard("short")  # ended within the moment
        heard = []
        while len(heard) < 2 and time.monotonic() - started < 10:
            message = pubsub.get_message(timeout=1.0)
            if message is not None:
                heard.append((message["channel"].decode(), message["data"]))
        assert time.monotonic() - started >= ANNOUNCE_AFTER_S
        assert sorted(heard) == sorted(
            [(store.keys.events("long"), b"started"), (store.keys.events("parent"), b"started")]
        )
        assert pubsub.get_message(timeout=ANNOUNCE_AFTER_S * 2) is None  # once each, and never for "short"
    finally:
        for task_id in ("long", "member"):
            beat.discard(task_id)
        pubsub.close()


def test_a_taken_mark_that_fails_is_tried_again_until_it_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The deferred mark (TakenBeat.mark_soon) of a job whose message is acked: a Redis that does not answer
    for a moment must not leave the task unmarked, or servers would call it lost with its worker alive."""
    url, redis_proc = start_redis(tmp_path / "redis.log")
    client = redis.Redis.from_url(url, socket_timeout=0.3, socket_connect_timeout=0.3)
    store = SyncStore(client, Keys(f"store-test-{uuid.uuid4()}"), Lifetimes(60, 60))
    key = stored(store, "late", now_ms())
    beat = TakenBeat(store, timeout_s=0.6)  # marks after 0.1 s, ticks every 0.05 s
    try:
        with caplog.at_level("WARNING", logger="mcp_celery.worker.heartbeat"):
            os.kill(redis_proc.pid, signal.SIGSTOP)  # hangs: the mark's call times out
            try:
                beat.mark_soon("late")
                wait_for(lambda: "could not mark its message taken" in caplog.text, 15, what="a failed mark")
            finally:
                os.kill(redis_proc.pid, signal.SIGCONT)
            wait_for(lambda: client.hexists(key, FIELD.TAKEN), 15, what="the mark, written once Redis answers")
        assert caplog.text.count("could not mark its message taken") == 1  # said once, then retried quietly
    finally:
        beat.discard("late")
        redis_proc.stop()


def parked_job(store_redis: redis.Redis, question_for_ms: int) -> tuple[redis.Redis, SyncStore, str]:
    """A task `parks` (under a prefix of its own) whose job started, asked `q-1` and parked, the question open
    for `question_for_ms`; its resume signature `{"task": "t"}`. The client, the store and the record's key."""
    client = redis.Redis(connection_pool=store_redis.connection_pool)
    store = SyncStore(client, Keys(f"store-test-{uuid.uuid4()}"), Lifetimes(60, 60))
    key = stored(store, "parks", now_ms())
    assert store.job_started("parks", 30_000) is not None
    question = json.dumps({"method": "elicitation/create", "params": {"message": "go?"}})
    store.post_inputs("parks", {"q-1": question}, now_ms())
    assert store.park("parks", ["q-1"], now_ms() + question_for_ms, '{"task": "t"}') == "parked"
    return client, store, key


def test_a_taken_mark_that_comes_after_the_job_parked_is_not_written_and_the_resumed_message_is_marked(
    store_redis: redis.Redis,
) -> None:
    """The deferred `taken` mark (TakenBeat.mark_soon, up to a second after the pool took the message) of a
    job that parked within that second, before the worker's main process heard its run end, finds no
    heartbeat in the record: written, the parked task read failed ("the worker that took the job's message
    was lost") once the mark ran out (bench.parking, 10,000 parked tasks). Once answered, the resumed
    message is marked as any taken message is."""
    client, store, key = parked_job(store_redis, question_for_ms=60_000)
    keys = store.keys
    assert store.mark_taken("parks", now_ms() + 30_000) is False
    assert not client.hexists(key, FIELD.TAKEN)
    resume = asyncio.run(answer_once(keys, "parks", "q-1"))
    assert resume == '{"task": "t"}'  # unparked: the caller sends the message again
    assert store.mark_taken("parks", now_ms() + 30_000) is True
    assert client.hexists(key, FIELD.TAKEN)


def test_a_run_lost_after_its_job_parked_leaves_the_task_parked_and_the_resumed_run_ends_it(
    store_redis: redis.Redis,
) -> None:
    """A pool process killed after its job parked but before Celery heard the run end (a warm shutdown's
    SIGTERM to the worker's process group): the worker's main process stores the loss as the job's outcome
    (`failed_outside_the_job`). The park stands, its lifetime too; the resumed run's outcome is the task's."""
    client, store, key = parked_job(store_redis, question_for_ms=600_000)
    keys = store.keys
    parked_for = client.ttl(key)
    lost = {"status": "FAILURE", "error": "WorkerLostError('Worker exited prematurely: signal 15 (SIGTERM)')"}
    store.job_ended("parks", asked=True, outcome=lost)
    assert not client.hexists(key, FIELD.OUTCOME) and client.hexists(key, FIELD.PARKED)
    assert client.ttl(key) > 60 and client.ttl(key) >= parked_for - 5  # not cut to the TTL from now
    assert asyncio.run(answer_once(keys, "parks", "q-1")) == '{"task": "t"}'
    store.job_ended("parks", asked=True, outcome={"status": "SUCCESS", "result": "done"})
    assert json.loads(client.hget(key, FIELD.OUTCOME) or b"{}")["result"] == "done"


async def answer_once(keys: Keys, task_id: str, wire_key: str) -> str | None:
    """The server's ANSWER of one request; the resume signature it returns."""
    client = async_client(redis_target(os.environ.get("TEST_MARKERS_URL") or os.environ["TEST_RESULT_BACKEND"]))
    try:
        answer = json.dumps({"action": "accept", "content": {}})
        taken, resume = await AsyncStore(client, keys, Lifetimes(60, 60)).answer(task_id, {wire_key: answer}, now_ms())
        assert taken == [wire_key]
        return resume
    finally:
        await client.aclose()


def test_with_min_replicas_a_job_gives_up_on_its_question_only_once_a_replica_has_that(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MCP_CELERY_REDIS_MIN_REPLICAS on the worker's side: a job's timeout stands only once a replica has its
    withdrawal of the question. Until then (in a failover, the job may be on a primary that Sentinel replaced)
    an answer the server acknowledges still reaches the job; with a replica that confirms, the timeout stands."""
    port, primary = start_plain(tmp_path / "primary", "primary")
    client = redis.Redis(port=port)
    keys, lifetimes = Keys(f"store-test-{uuid.uuid4()}"), Lifetimes(60, 60)
    plain, durable = SyncStore(client, keys, lifetimes), SyncStore(client, keys, lifetimes, Durability(1, 100))
    question = json.dumps({"method": "elicitation/create", "params": {"message": "go?"}})
    replica = None
    try:
        stored(plain, "asked", now_ms())
        plain.post_inputs("asked", {"q-1": question}, now_ms())
        ended: list[AnswerWait] = []
        waiting = threading.Thread(target=lambda: ended.append(durable.wait_for_answers("asked", ["q-1"], 0.2)))
        with caplog.at_level("WARNING", logger="mcp_celery.store.sync"):
            waiting.start()
            unconfirmed = "giving up on the question reached the Redis primary, but 0 of the 1 replicas"
            wait_for(lambda: caplog.text.count(unconfirmed) >= 3, 20, what="withdrawals no replica confirmed")
            assert waiting.is_alive() and not ended  # well past its 0.2 s, and still waiting
            answer = {"action": "accept", "content": {}}
            client.hset(keys.answers("asked"), "q-1", json.dumps(answer))  # as a server stores an answer
            client.lpush(keys.bell("asked"), "answer")
            waiting.join(20)
        assert ended and ended[0].answers == {"q-1": json.dumps(answer)} and not ended[0].missing

        replica_port, replica = start_plain(tmp_path / "replica", "replica", "--replicaof", "127.0.0.1", str(port))
        wait_for(lambda: client.execute_command("WAIT", 1, 100) == 1, 20, what="the replica to confirm writes")
        plain.post_inputs("asked", {"q-2": question}, now_ms())
        assert durable.wait_for_answers("asked", ["q-2"], 0.2).missing == ("q-2",)
        replica_client = redis.Redis(port=replica_port)
        assert not replica_client.hexists(keys.task("asked"), INPUT_FIELD_PREFIX + "q-2")  # withdrawn there too

        # The server's confirmation of a new task: a connection that does not find the record says so.
        asyncio.run(server_confirms(port, keys, lifetimes))
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


async def server_confirms(port: int, keys: Keys, lifetimes: Lifetimes) -> None:
    client = async_client(redis_target(f"redis://127.0.0.1:{port}"))
    server = AsyncStore(client, keys, lifetimes, Durability(1, 100))
    try:
        await server.confirm_replicated("asked")
        with pytest.raises(NotOnPrimary, match="not on the Redis primary reached now"):
            await server.confirm_replicated("never-created")
    finally:
        await client.aclose()
