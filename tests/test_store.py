"""The worker's store against real Redis: its blocking waits always end."""

from __future__ import annotations

import time

import redis

from mcp_celery.store.schema import Keys, Lifetimes
from mcp_celery.store.sync import SyncStore


def test_waits_shorter_than_redis_can_time_never_block_for_ever(store_redis: redis.Redis) -> None:
    """Redis truncates a BLPOP timeout to whole milliseconds and blocks for ever on 0 (0.001 s did so on 6.2)."""
    client = redis.Redis(connection_pool=store_redis.connection_pool)
    store = SyncStore(client, Keys("store-test"), Lifetimes(60, 60))
    for seconds in (0.0, 0.0004, 0.001, 0.0015, 0.009, 0.0101, 0.05):
        started = time.monotonic()
        assert store.sleep_unless_cancelled("no-such-task", seconds) is False
        assert time.monotonic() - started < 1.0, seconds
