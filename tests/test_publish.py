"""The native Redis publisher (`mcp_celery.server.publish`): kombu's own message, sent by asyncio.

The message must be the very bytes kombu's Redis transport would send (apart from its random
delivery tag), a worker must run it, and a broker other than plain Redis keeps Celery's path.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from celery import Celery

import mcp_celery
from mcp_celery.server.publish import Publisher
from tests.support import HttpClient, Process, session_redis, start_http_server, start_worker

_APPS = itertools.count()


def _app(broker: str, backend: str) -> Celery:
    app = Celery("publish_compat", broker=broker, backend=backend)
    mcp_celery.configure_app(app)

    # A plain task under a name of its own per app: the publisher treats every task alike.
    app.task(name=f"publish_compat.shout.{next(_APPS)}")(_upper)
    return app


def _upper(text: str) -> str:
    return text.upper()


def _shout(app: Celery) -> Any:
    return next(task for name, task in app.tasks.items() if name.startswith("publish_compat.shout"))


def _native_commands(app: Celery, store_url: str, task_id: str) -> tuple[list[Any], bool]:
    """The commands the publisher builds for one `shout` call, and whether it shares the store's database."""

    async def build() -> tuple[list[Any], bool]:
        store = aioredis.Redis.from_url(store_url)
        publisher = Publisher(app, store)
        try:
            assert await publisher.native()
            commands = publisher.build(_shout(app), kwargs={"text": "hi"}, task_id=task_id)
            return commands, publisher.shares_store
        finally:
            await publisher.aclose()
            await store.aclose()

    return anyio.run(build)


@pytest.fixture
def compat_db() -> Iterator[str]:
    url = session_redis(9)
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


def test_the_native_message_is_byte_for_byte_the_one_kombu_sends(compat_db: str) -> None:
    app = _app(compat_db, compat_db)
    commands, shares = _native_commands(app, compat_db, "t-compat")
    assert shares
    names = [name for name, _ in commands]
    assert names == ["lpush", "publish"]  # the job's message, then the task-sent event (celeryev fanout)
    queue, native = commands[0][1]
    topic, native_event = commands[1][1]

    r = redis.Redis.from_url(compat_db)
    events = r.pubsub()
    events.subscribe(topic)
    assert events.get_message(timeout=5)["type"] == "subscribe"
    r.delete(queue)
    _shout(app).apply_async(kwargs={"text": "hi"}, task_id="t-compat")  # Celery's own path
    sent = r.rpop(queue)
    assert isinstance(sent, bytes)
    kombu_tag = json.loads(sent)["properties"]["delivery_tag"]
    native_tag = json.loads(native)["properties"]["delivery_tag"]
    assert sent.replace(kombu_tag.encode(), native_tag.encode()) == native.encode()

    event = events.get_message(timeout=5)
    assert event is not None and event["channel"] == topic.encode()
    kombu_event, ours = json.loads(event["data"]), json.loads(native_event)
    assert sorted(kombu_event) == sorted(ours) and kombu_event["headers"] == ours["headers"]
    events.close()


def test_a_broker_on_another_database_gets_its_own_round_trip(compat_db: str) -> None:
    store = session_redis(8)
    app = _app(compat_db, store)
    commands, shares = _native_commands(app, store, "t-other")
    assert not shares
    assert commands[0][0] == "lpush"


def _is_native(app: Celery, store_url: str) -> bool:
    async def native() -> bool:
        store = aioredis.Redis.from_url(store_url)
        publisher = Publisher(app, store)
        try:
            return await publisher.native()
        finally:
            await publisher.aclose()
            await store.aclose()

    return anyio.run(native)


def test_a_rabbitmq_broker_keeps_celerys_own_path(compat_db: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), 1).close()
    except OSError:
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    assert not _is_native(_app("amqp://guest:guest@127.0.0.1:5672//", compat_db), compat_db)


def test_a_redis_broker_with_a_global_key_prefix_keeps_celerys_own_path(compat_db: str) -> None:
    """kombu prefixes keys in its own client; the commands the batch hands over are unprefixed."""
    app = _app(compat_db, compat_db)
    app.conf.broker_transport_options = {"global_keyprefix": "tenant:"}
    assert not _is_native(app, compat_db)
    assert _is_native(_app(compat_db, compat_db), compat_db)


def test_failover_broker_urls_keep_celerys_own_path(compat_db: str) -> None:
    assert not _is_native(_app(f"{compat_db};{compat_db}", compat_db), compat_db)


def test_a_worker_runs_jobs_published_in_the_records_round_trip(env: dict[str, str], logs: Path) -> None:
    """Broker and records in one database: the record and the message go in one pipeline."""
    shared = session_redis(7)
    redis.Redis.from_url(shared).flushdb()
    same_db = {**env, "TEST_BROKER_URL": shared, "TEST_RESULT_BACKEND": shared}
    worker: Process = start_worker(same_db, logs / "same-db-worker.log", name=f"samedb-{os.getpid()}")
    url, server = start_http_server(same_db, logs / "same-db-server.log")
    c = HttpClient(url)
    try:
        handles = [c.start("echo", {"text": f"n{i}"}) for i in range(20)]
        finished = [c.wait(handle) for handle in handles]
        assert [t["status"] for t in finished] == ["completed"] * 20
    finally:
        c.close()
        server.stop()
        worker.stop()
        redis.Redis.from_url(shared).flushdb()
