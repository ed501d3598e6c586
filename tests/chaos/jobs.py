"""The chaos test's jobs: each first appends its execution (task id, pid, worker pid) to a Redis list.

Their own Celery app on the chaos test's Redis (`CHAOS_REDIS`: broker db 0, results and records
db 1, executions db 3), so the executions log outlives any worker and shows a second run.
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

import mcp_celery

BASE = os.environ.get("CHAOS_REDIS", "redis://127.0.0.1:6379").rstrip("/")
RUNS_KEY = "chaos:runs"

app = Celery("chaos_jobs", broker=f"{BASE}/0", backend=f"{BASE}/1")
mcp_celery.configure_app(app)

runs = redis.Redis.from_url(f"{BASE}/3")

VALUE = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}


def record_run(ctx: mcp_celery.JobContext) -> None:
    """Append this execution to the log, waiting out a Redis restart (the log must not miss a run)."""
    entry = json.dumps({"task": ctx.task_id, "pid": os.getpid(), "worker": os.getppid(), "t": time.time()})
    deadline = time.monotonic() + 120
    while True:
        try:
            runs.rpush(RUNS_KEY, entry)
            return
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@mcp_celery.tool(app)
def chaos_sleep(ctx: mcp_celery.JobContext, seconds: float) -> str:
    """Sleeps (cancellable, riding out a Redis restart) and says which task it was."""
    record_run(ctx)
    ctx.sleep(seconds)
    return f"slept {ctx.task_id}"


@mcp_celery.tool(app, task_mode="required")
def chaos_ask(ctx: mcp_celery.JobContext) -> str:
    """Asks for a value and returns it with its task id (shows that no answer is lost)."""
    record_run(ctx)
    answer = ctx.elicit("A value?", VALUE, timeout=600)
    return f"{ctx.task_id}:{(answer.content or {}).get('value')}"
