"""The native Redis publisher (`mcp_celery.server.engine.publish`): kombu's own message, sent by asyncio.

The message must be the very bytes kombu's Redis transport would send (apart from its random
delivery tag), a worker must run it, and a broker other than plain Redis keeps Celery's path.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import kombu
import pytest
import redis
from celery import Celery

import mcp_celery
from mcp_celery.server.engine.publish import Publisher
from mcp_celery.store.connect import redis_target
from mcp_celery.store.schema import Keys
from tests.support.harness import (
    HttpClient,
    Process,
    require_service,
    session_redis,
    start_http_server,
    start_worker,
    tcp_unavailable,
    wait_for,
)

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
        publisher = Publisher(app, redis_target(store_url))
        try:
            assert await publisher.native()
            commands = publisher.build(_shout(app), kwargs={"text": "hi"}, task_id=task_id)
            return commands, publisher.shares_store
        finally:
            await publisher.aclose()

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
        publisher = Publisher(app, redis_target(store_url))
        try:
            return await publisher.native()
        finally:
            await publisher.aclose()

    return anyio.run(native)


def rabbitmq_url() -> str:
    """TEST_BROKER_URL when it names RabbitMQ (e.g. a vhost of your own), else the local default."""
    url = os.environ.get("TEST_BROKER_URL", "")
    return url if url.startswith("amqp") else "amqp://guest:guest@127.0.0.1:5672//"


def _publish_on_thread(app: Celery, store_url: str, **options: Any) -> None:
    async def publish() -> None:
        publisher = Publisher(app, redis_target(store_url))
        try:
            await publisher.publish_on_thread(_shout(app), **options)
        finally:
            await publisher.aclose()

    anyio.run(publish)


def test_a_rabbitmq_broker_keeps_celerys_own_path(compat_db: str) -> None:
    """Not native, and the job's message still reaches RabbitMQ: by `apply_async`, in a queue of this test's own."""
    url = rabbitmq_url()
    parts = urlsplit(url)
    require_service("rabbitmq", tcp_unavailable(parts.hostname or "127.0.0.1", parts.port or 5672))
    app = _app(url, compat_db)
    queue, task_id = f"publish-compat-{uuid.uuid4()}", f"t-{uuid.uuid4()}"
    try:
        assert not _is_native(app, compat_db)
        _publish_on_thread(app, compat_db, kwargs={"text": "hi"}, task_id=task_id, queue=queue)
        with app.connection_for_write() as connection:
            channel = connection.channel()
            published = kombu.Queue(queue, routing_key=queue)(channel)  # bound, not declared: Celery declared it
            try:
                message = wait_for(lambda: published.get(no_ack=True), 10, 0.05, "the message in RabbitMQ")
            finally:
                channel.queue_delete(queue)
        assert (message.headers["task"], message.headers["id"]) == (_shout(app).name, task_id)
        assert message.decode()[1] == {"text": "hi"}  # Celery's protocol 2 body: args, kwargs, embed
    finally:
        app.close()


def test_a_redis_broker_with_a_global_key_prefix_keeps_celerys_own_path(compat_db: str) -> None:
    """kombu prefixes keys in its own client; the commands the batch hands over are unprefixed."""
    app = _app(compat_db, compat_db)
    app.conf.broker_transport_options = {"global_keyprefix": "tenant:"}
    assert not _is_native(app, compat_db)
    assert _is_native(_app(compat_db, compat_db), compat_db)


def test_failover_broker_urls_keep_celerys_own_path(compat_db: str) -> None:
    assert not _is_native(_app(f"{compat_db};{compat_db}", compat_db), compat_db)


class ChunkProxy:
    """A TCP proxy to Redis that keeps every chunk a client sent, as one `recv` got it.

    What a client writes before it reads a reply (a pipeline) can arrive in one chunk. What it
    writes after a reply (another round trip) never shares a chunk with what came before: that
    reply was only sent once this proxy had passed the earlier bytes on.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.chunks: list[bytes] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # the listener was closed
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, keep: bool) -> None:
        try:
            while data := source.recv(1 << 20):
                if keep:
                    with self._lock:
                        self.chunks.append(data)
                sink.sendall(data)
        except OSError:  # either side went away
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def sent(self) -> list[bytes]:
        with self._lock:
            return list(self.chunks)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self.listener.close()
        with self._lock:
            for end in self._sockets:
                end.close()


def record_then_message(chunk: bytes, task_id: str) -> bool:
    """Whether `chunk` writes the task's record (HSET of its key), then queues its job (an LPUSH naming it)."""
    key = Keys().task(task_id).encode()
    record = chunk.find(b"$4\r\nHSET\r\n$%d\r\n%s\r\n" % (len(key), key))
    push = chunk.find(b"$5\r\nLPUSH\r\n", record + 1) if record >= 0 else -1
    return push > record >= 0 and task_id.encode() in chunk[push:]


def test_a_worker_runs_jobs_published_in_the_records_round_trip(env: dict[str, str], logs: Path) -> None:
    """Broker and records in one database: the record and the message go in one pipeline.

    The server reaches Redis through a ChunkProxy (the worker directly): each record and its job's
    message must be in one chunk the server sent, record first."""
    shared = session_redis(7)
    redis.Redis.from_url(shared).flushdb()
    parts = urlsplit(shared)
    proxy = ChunkProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    proxied = f"redis://127.0.0.1:{proxy.port}{parts.path}"
    direct = {**env, "TEST_BROKER_URL": shared, "TEST_RESULT_BACKEND": shared}
    worker: Process = start_worker(direct, logs / "same-db-worker.log", name=f"samedb-{os.getpid()}")
    url, server = start_http_server(
        {**env, "TEST_BROKER_URL": proxied, "TEST_RESULT_BACKEND": proxied}, logs / "same-db-server.log"
    )
    c = HttpClient(url)
    try:
        handles = [c.start("echo", {"text": f"n{i}"}) for i in range(20)]
        sent = proxy.sent()
        for handle in handles:
            assert any(record_then_message(chunk, handle) for chunk in sent), f"{handle}: not in one pipeline"
        finished = [c.wait(handle) for handle in handles]
        assert [t["status"] for t in finished] == ["completed"] * 20
    finally:
        c.close()
        server.stop()
        worker.stop()
        proxy.close()
        redis.Redis.from_url(shared).flushdb()
