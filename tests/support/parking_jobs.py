"""Jobs that ask a person and park (`mcp_celery.worker.parking`), on an app of their own.

Their own broker and results (databases 3 and 4 of the session's Redis, or PARKING_BROKER_URL and
PARKING_BACKEND_URL), so that a worker at `-c 1` serves only them. mcp-celery's state is the results'
Redis, or in a store pass of the tests the pass's store (MCP_CELERY_REDIS_URL: the ACL user, the
cluster), under a key prefix of its own (`PREFIX`), so that this deployment's figures (`mcp-celery
top`) count its tasks only. Each job counts in Redis how often its step before the question ran
(`<marker>:before`) and how often the step it wraps in `ctx.once` ran (`<marker>:once`), so a test
can tell a resume from the top from work done twice.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import mcp_celery
from mcp_celery.store.connect import redis_target, sync_client
from mcp_celery.store.schema import Keys

_BASE = os.environ.get("MCP_CELERY_TEST_REDIS", "redis://127.0.0.1:6379")
#: The RabbitMQ pass (TEST_BROKER_URL amqp://) sends these jobs through RabbitMQ too, on a queue of their own.
_RABBIT = os.environ.get("TEST_BROKER_URL", "") if os.environ.get("TEST_BROKER_URL", "").startswith("amqp") else ""
BROKER = os.environ.get("PARKING_BROKER_URL") or _RABBIT or f"{_BASE}/3"
BACKEND = os.environ.get("PARKING_BACKEND_URL") or f"{_BASE}/4"
QUEUE = "parking"

#: mcp-celery's store for these jobs, and its key prefix (inside the README's ACL rule, `mcp-celery:*`).
STORE = os.environ.get("MCP_CELERY_REDIS_URL") or BACKEND
PREFIX = "mcp-celery:parking"
#: The store as an administrator reads it: a store pass's admin URL (tests/conftest.py), else the store's own.
_STORE_ADMIN = STORE if STORE == BACKEND else os.environ.get("TEST_MARKERS_URL") or os.environ["TEST_RESULT_BACKEND"]

app = Celery("parking_jobs", broker=BROKER, backend=BACKEND)
app.conf.task_default_queue = QUEUE
mcp_celery.configure_app(app)
#: The jobs' counters, beside Celery's results.
markers = redis.Redis.from_url(BACKEND)
#: The records, the parked and live indexes (`Keys(PREFIX)`), read by the tests.
records: Any = sync_client(redis_target(_STORE_ADMIN), socket_timeout=None)
keys = Keys(PREFIX)

APPROVE = {"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]}


def _ask(ctx: mcp_celery.JobContext, marker: str, work_s: float, timeout: float) -> str:
    markers.incr(f"{marker}:before")  # outside ctx.once: runs again on every resume
    ctx.sleep(work_s)
    built = ctx.once("build", lambda: f"build-{markers.incr(f'{marker}:once')}")
    answer = ctx.elicit(f"Push {marker}?", APPROVE, timeout=timeout)
    return f"{built} {marker} approve={(answer.content or {}).get('approve')}"


@mcp_celery.tool(app, park_after_s=0)
def park_at_once(ctx: mcp_celery.JobContext, marker: str, work_s: float = 0.2, timeout: float = 3600) -> str:
    """Work a moment, then ask; parks as soon as it asks."""
    return _ask(ctx, marker, work_s, timeout)


@mcp_celery.tool(app, park_after_s=30)
def park_late(ctx: mcp_celery.JobContext, marker: str, work_s: float = 0.0, timeout: float = 3600) -> str:
    """Ask, and wait in the worker process for up to 30 s before parking."""
    return _ask(ctx, marker, work_s, timeout)


@mcp_celery.tool(app, park_after_s=0)
def two_questions(ctx: mcp_celery.JobContext, marker: str) -> str:
    """Two questions one after the other: parks at each, through a handler that catches everything else."""
    markers.incr(f"{marker}:before")
    try:
        first = ctx.elicit("First?", APPROVE).content or {}
        second = ctx.elicit("Second?", APPROVE).content or {}
    except mcp_celery.JobSignal:
        raise  # parking passes
    except BaseException as exc:  # a job's catch-all, which must not swallow the park
        return f"swallowed {type(exc).__name__}"
    return f"{first.get('approve')} {second.get('approve')}"


@mcp_celery.tool(app)
def no_question(text: str) -> str:
    """No question at all."""
    return text


@mcp_celery.tool(app, park_after_s=0, retry_on_worker_loss=True)
def park_at_least_once(ctx: mcp_celery.JobContext, marker: str) -> str:
    """An at-least-once job (late ack) that parks: its message is acknowledged all the same."""
    return _ask(ctx, marker, 0.0, 3600)
