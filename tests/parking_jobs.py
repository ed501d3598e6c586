"""Jobs that ask a person and park (`mcp_celery.worker.parking`), on an app of their own.

Their own broker and results (databases 3 and 4 of the session's Redis, or PARKING_BROKER_URL and
PARKING_BACKEND_URL), so that a worker at `-c 1` serves only them. Each job counts in Redis how often
its step before the question ran (`<marker>:before`) and how often the step it wraps in `ctx.once`
ran (`<marker>:once`), so a test can tell a resume from the top from work done twice.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

import mcp_celery

_BASE = os.environ.get("MCP_CELERY_TEST_REDIS", "redis://127.0.0.1:6379")
#: The RabbitMQ pass (TEST_BROKER_URL amqp://) sends these jobs through RabbitMQ too, on a queue of their own.
_RABBIT = os.environ.get("TEST_BROKER_URL", "") if os.environ.get("TEST_BROKER_URL", "").startswith("amqp") else ""
BROKER = os.environ.get("PARKING_BROKER_URL") or _RABBIT or f"{_BASE}/3"
BACKEND = os.environ.get("PARKING_BACKEND_URL") or f"{_BASE}/4"
QUEUE = "parking"

app = Celery("parking_jobs", broker=BROKER, backend=BACKEND)
app.conf.task_default_queue = QUEUE
mcp_celery.configure_app(app)
markers = redis.Redis.from_url(BACKEND)

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
    """Two questions one after the other: parks at each."""
    markers.incr(f"{marker}:before")
    first = ctx.elicit("First?", APPROVE).content or {}
    second = ctx.elicit("Second?", APPROVE).content or {}
    return f"{first.get('approve')} {second.get('approve')}"


@mcp_celery.tool(app)
def no_question(text: str) -> str:
    """No question at all."""
    return text


@mcp_celery.tool(app, park_after_s=0, retry_on_worker_loss=True)
def park_at_least_once(ctx: mcp_celery.JobContext, marker: str) -> str:
    """An at-least-once job (late ack) that parks: its message is acknowledged all the same."""
    return _ask(ctx, marker, 0.0, 3600)
