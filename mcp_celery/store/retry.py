"""How the worker's store waits out a Redis that is away for a moment (restarting, failing over).

Tier 1. A write that fails for now (Redis unreachable, or, with `Durability.min_replicas`, too few
replicas confirmed it) is tried again every `RECONNECT_PAUSE_S`, for up to a bound: a job's question
and outcome must not be lost to a restart, nor a decision to a failover.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from mcp_celery.store.replication import NotReplicated

__all__ = ["MIN_BLOCK_S", "NOT_YET", "OUTCOME_RETRY_S", "RECONNECT_PAUSE_S", "while_unreachable"]

logger = logging.getLogger("mcp_celery.store.sync")  # the worker's store's warnings, under one name

T = TypeVar("T")

#: The shortest wait sent to Redis as a blocking command; shorter ones are slept here.
MIN_BLOCK_S = 0.01
#: How long a waiting job pauses before trying an unreachable Redis again.
RECONNECT_PAUSE_S = 0.5
#: How long a finished job keeps trying to store its outcome while Redis is unreachable (restarting).
OUTCOME_RETRY_S = 120.0

#: A write that failed for now: Redis unreachable, or too few replicas confirmed it.
NOT_YET = (redis.ConnectionError, redis.TimeoutError, NotReplicated)


def while_unreachable(task_id: str, doing: str, call: Callable[[], T], retry_s: float = OUTCOME_RETRY_S) -> T:
    """`call()`, tried again every `RECONNECT_PAUSE_S` for up to `retry_s` while Redis is unreachable
    (or, with `Durability.min_replicas`, while too few replicas confirm its write)."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return call()
        except NOT_YET as exc:
            if time.monotonic() >= deadline:
                raise
            logger.warning("task %s: Redis unreachable %s (%s); retrying", task_id, doing, exc or type(exc).__name__)
            time.sleep(RECONNECT_PAUSE_S)
