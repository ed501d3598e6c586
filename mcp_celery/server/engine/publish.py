"""Queueing a job: Celery's own message, written on a Redis broker in the record's round trip.

Server tier. `Task.apply_async` does blocking I/O, so the server used to run it on a worker
thread: under load that thread waited on the GIL for the busy event loop at every socket call,
and each publish also took a producer from Celery's pool. On a plain Redis broker this module
lets Celery and kombu build the message exactly as they always do (routing, headers, the
`task-sent` event, the signals), but inside a kombu publish batch whose commands are kept
instead of sent: kombu's Redis transport computes every final command itself (`LPUSH` of the
very bytes it would send, `PEXPIRE` for expiring queues, `PUBLISH` for fanout exchanges such
as `celeryev`), and the server sends them with asyncio redis-py. Same Redis and database as the
records: in the record's own pipeline, after it (one round trip, record first, so a worker never
starts a job whose record is missing). Another Redis: a second pipeline once the record is
written. Any other broker (RabbitMQ, SQS, Sentinel, a key prefix, TLS, a unix socket, several
URLs) keeps `apply_async` on a worker thread.

What still blocks: a topic or fanout task exchange (in `task_routes`) makes kombu read its
binding table on every publish. Direct exchanges (the default) route without I/O. The default
queue is declared once at start-up, on a thread; other queues are declared by the workers
that consume them, not on every publish.

A connection dropped while a pipeline is in flight can leave it unknown whether the message
went out; redis-py retries the pipeline then, so a job may be queued twice, as Celery's own
publish retry can do too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import anyio
import redis
from celery import Celery

from mcp_celery.store.connect import AsyncRedis, RedisTarget, async_client

__all__ = ["Command", "Publisher"]

logger = logging.getLogger(__name__)

#: Seconds between two attempts to reach a broker that could not be reached.
RETRY_OPEN_S = 5.0
#: One Redis command as kombu's Redis transport would run it: (method name, arguments).
Command = tuple[str, tuple[Any, ...]]


class _KeptBatch:
    """Stands in for kombu's Redis `PublishBatch`: kombu routes each message and adds its final
    commands here, and nothing is sent (the caller sends them)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[Command] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))

    def flush(self) -> None:
        """Nothing to do: the commands stay here for the caller."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Nothing was acquired."""


class Publisher:
    """Builds and sends the messages of one Celery app; `aclose` when done."""

    def __init__(self, app: Celery, store: RedisTarget) -> None:
        self.app = app
        self._store = store
        self._connection: Any = None
        self._channel: Any = None
        self._producer: Any = None
        self._kept: _KeptBatch | None = None
        self._broker_redis: AsyncRedis | None = None
        self._decided = False  # whether the broker is known to be plain Redis (native) or not
        self._retry_at = 0.0  # after a failed look at the broker, when to look again
        self._lock = anyio.Lock()
        #: The broker is the records' Redis database: its commands join the record's pipeline.
        self.shares_store = False

    async def native(self) -> bool:
        """Whether messages go out through this process's asyncio Redis (else `apply_async` on a thread).

        The first call connects kombu (on a thread: it does blocking I/O) to look at the broker.
        While the broker cannot be reached this answers False, so calls take Celery's own path
        (with its publish retries and its error), and the look is tried again after a pause.
        """
        if not self._decided and anyio.current_time() >= self._retry_at:
            async with self._lock:
                if not self._decided and anyio.current_time() >= self._retry_at:
                    try:
                        await anyio.to_thread.run_sync(self._open_kombu)
                        self._decided = True
                    except Exception:  # noqa: BLE001  (kombu's connection errors vary by transport)
                        self._retry_at = anyio.current_time() + RETRY_OPEN_S
                        logger.warning("could not reach the broker; trying again in %g s", RETRY_OPEN_S, exc_info=True)
        return self._producer is not None

    def _open_kombu(self) -> None:
        from kombu.transport import redis as kombu_redis

        connection = self.app.connection_for_write()
        # Several broker URLs (failover) or another transport: Celery's own path.
        if type(connection.transport) is not kombu_redis.Transport or len(connection.alt) > 1:
            connection.release()
            return
        try:
            channel: Any = connection.channel()  # connects once, without Celery's long retry loop
        except BaseException:
            connection.release()
            raise
        self._connection, self._channel = connection, channel
        try:
            self._adopt(channel)
        except BaseException:
            self._close_kombu()
            raise

    def _adopt(self, channel: Any) -> None:
        """Use `channel` if kombu's own commands for it can run on a plain asyncio client; else let go."""
        pool = channel.client.connection_pool
        plain_tcp = issubclass(pool.connection_class, redis.Connection) and not issubclass(
            pool.connection_class, redis.SSLConnection
        )
        if channel.global_keyprefix or not channel.supports_batch_publish or not plain_tcp:
            self._close_kombu()
            return
        producer = self.app.amqp.Producer(channel, auto_declare=False)
        producer.maybe_declare(self.app.amqp.default_queue)  # as apply_async would, once, off the loop
        channel.create_publish_batch = self._new_batch
        kwargs = pool.connection_kwargs
        broker = RedisTarget.tcp(
            kwargs.get("host") or "localhost",
            int(kwargs.get("port") or 6379),
            int(kwargs.get("db") or 0),
            kwargs.get("username"),
            kwargs.get("password"),
        )
        self.shares_store = broker.tcp_address() == self._store.tcp_address()
        if not self.shares_store:
            self._broker_redis = async_client(broker, client_name="mcp-celery-publish")
        self._producer = producer

    def _new_batch(self, max_size: int) -> _KeptBatch:
        self._kept = _KeptBatch(self._channel)
        return self._kept

    def build(self, task: Any, **options: Any) -> list[Command]:
        """`task.apply_async(**options)` with nothing sent; returns the commands that publish its message.

        Raises:
            RuntimeError: the publisher is not native.
        """
        if self._producer is None:
            raise RuntimeError("the native publisher is not open")
        self._kept = None
        batch: AbstractContextManager[Any] = self._producer.batch()
        with batch:  # synchronous: no other coroutine can publish through the producer meanwhile
            # Nothing in here does I/O, so kombu's retry wrapper has nothing to retry; and the
            # queue was declared at start-up (kombu would otherwise bind copies of it every time).
            task.apply_async(producer=self._producer, retry=False, declare=[], **options)
        kept, self._kept = self._kept, None
        return [] if kept is None else kept.commands

    async def send(self, commands: Sequence[Command]) -> None:
        """Run `commands` on the broker when it is not the records' database (else they join the record's pipeline)."""
        if self._broker_redis is None:
            raise RuntimeError("the broker shares the records' Redis: send the commands in its pipeline")
        async with self._broker_redis.pipeline(transaction=False) as pipe:
            add_commands(pipe, commands)
            await pipe.execute()

    async def publish_on_thread(self, task: Any, **options: Any) -> None:
        """Celery's own path, for brokers other than plain Redis: `apply_async` with a pooled producer."""
        await anyio.to_thread.run_sync(lambda: task.apply_async(**options))

    async def aclose(self) -> None:
        if self._broker_redis is not None:
            await self._broker_redis.aclose()
            self._broker_redis = None
        self._close_kombu()

    def _close_kombu(self) -> None:
        self._producer = self._channel = None
        if self._connection is not None:
            self._connection.release()
            self._connection = None


def add_commands(pipe: Any, commands: Sequence[Command]) -> None:
    """Queue kombu's commands on a redis-py pipeline (sync or asyncio: the method names are the same)."""
    for name, args in commands:
        getattr(pipe, name)(*args)
