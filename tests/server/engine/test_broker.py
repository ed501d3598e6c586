"""The server's view of a Redis broker, against messages real kombu publishes and delivers.

No worker: Celery publishes (`send_task`), kombu's own channel delivers (`basic_get` without
ack, which copies the message into kombu's unacked hash as a consumer does), on a database of
the session's Redis of this test's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from celery import Celery

from mcp_celery.server.engine.broker import DELIVERED, NOWHERE, QUEUED, STALE, RedisBroker
from tests.support.harness import session_redis

QUEUE = "probe"


@pytest.fixture
def app() -> Iterator[Celery]:
    url = session_redis(7)
    redis.Redis.from_url(url).flushdb()
    celery = Celery("probe", broker=url, backend=session_redis(13), set_as_current=False)
    yield celery
    redis.Redis.from_url(url).flushdb()


def publish(app: Celery, task_id: str, priority: int = 0) -> None:
    app.send_task("probe.job", kwargs={"about": "task-other"}, task_id=task_id, queue=QUEUE, priority=priority)


def deliver(app: Celery) -> object:
    """Take the oldest message as a consumer does, leaving it unacked; returns kombu's message."""
    with app.connection_for_read() as connection:
        channel: Any = connection.default_channel  # kombu's virtual channel
        message = channel.basic_get(QUEUE, no_ack=False)
        assert message is not None
        channel.qos._delivered.clear()  # a dead consumer never restores it
        return message


def whereabouts(app: Celery, stale_before: dict[str, float]) -> dict[str, tuple[int, str]]:
    async def look() -> dict[str, tuple[int, str]]:
        broker = RedisBroker.of_app(app)
        assert broker is not None
        try:
            found = await broker.whereabouts(QUEUE, stale_before)
            return {task_id: (w.where, w.tag) for task_id, w in found.items()}
        finally:
            await broker.aclose()

    return asyncio.run(look())


def test_a_message_is_found_in_its_queue_in_a_workers_hands_or_nowhere(app: Celery) -> None:
    publish(app, "held")
    deliver(app)
    publish(app, "queued")
    publish(app, "urgent", priority=5)  # a list of its own: probe\x06\x163
    ids = {"held": 0.0, "queued": 0.0, "urgent": 0.0, "task-other": 0.0, "gone": 0.0}
    found = whereabouts(app, ids)
    assert {k: v[0] for k, v in found.items()} == {
        "held": DELIVERED,
        "queued": QUEUED,
        "urgent": QUEUED,
        "task-other": NOWHERE,  # named in the arguments (kwargsrepr), not the message's task id
        "gone": NOWHERE,
    }
    # Delivered before the time given: its worker is gone, and the tag comes back for REQUEUE.
    stale = whereabouts(app, {"held": time.time() + 1, "queued": time.time() + 1})
    assert stale["held"][0] == STALE and stale["held"][1] and stale["queued"] == (QUEUED, "")


def test_a_stale_message_is_put_back_once_however_many_servers_try(app: Celery) -> None:
    publish(app, "lost-run")
    deliver(app)
    raw = redis.Redis.from_url(app.conf.broker_url)

    async def requeue_from_two_servers() -> list[bool]:
        brokers = [RedisBroker(aioredis.Redis.from_url(app.conf.broker_url), {}) for _ in range(2)]
        try:
            sightings = [await b.whereabouts(QUEUE, {"lost-run": time.time() + 1}) for b in brokers]
            moves = (b.requeue(QUEUE, s["lost-run"]) for b, s in zip(brokers, sightings, strict=True))
            return list(await asyncio.gather(*moves))
        finally:
            for b in brokers:
                await b.aclose()

    assert sorted(asyncio.run(requeue_from_two_servers())) == [False, True]
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0 and raw.llen(QUEUE) == 1
    # The message kombu delivers next is that one, flagged redelivered as kombu's own restore does.
    with app.connection_for_read() as connection:
        channel: Any = connection.default_channel
        message = channel.basic_get(QUEUE, no_ack=True)
    assert message is not None and message.headers["id"] == "lost-run"
    assert message.delivery_info["redelivered"] is True


def test_the_oldest_and_the_newest_messages_of_a_long_queue_are_found(app: Celery) -> None:
    publish(app, "oldest")
    with app.producer_or_acquire() as producer:
        for i in range(3000):
            app.send_task("probe.job", task_id=f"filler-{i}", queue=QUEUE, producer=producer)
    raw = redis.Redis.from_url(app.conf.broker_url)
    assert raw.llen(QUEUE) == 3001
    assert whereabouts(app, {"oldest": 0.0, "filler-0": 0.0})["oldest"][0] == QUEUED
    assert whereabouts(app, {"filler-2999": 0.0})["filler-2999"][0] == QUEUED  # the newest: a whole pass
