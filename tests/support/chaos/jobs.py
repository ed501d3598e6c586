"""The chaos test's jobs: each first appends its execution (task id, pid, worker pid) to a Redis list.

Their own Celery app on the chaos test's Redis (`CHAOS_REDIS`: broker db 0, results and records
db 1, executions db 3), so the executions log outlives any worker and shows a second run. The
parking jobs (`chaos_park*`) also log each call of the work they wrap in `ctx.once` (`ONCE_KEY`), so
the verdict can tell a resume that skipped it from work done twice.
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
#: Each call of a parking job's `ctx.once` work: task id, pid, worker pid, wall time.
ONCE_KEY = "chaos:once"

app = Celery("chaos_jobs", broker=f"{BASE}/0", backend=f"{BASE}/1")
mcp_celery.configure_app(app)

runs = redis.Redis.from_url(f"{BASE}/3")

VALUE = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}


def record_run(ctx: mcp_celery.JobContext, key: str = RUNS_KEY) -> None:
    """Append this execution to the log, waiting out a Redis restart (the log must not miss a run)."""
    entry = json.dumps({"task": ctx.task_id, "pid": os.getpid(), "worker": os.getppid(), "t": time.time()})
    deadline = time.monotonic() + 120
    sent = False
    while True:
        try:
            # A push whose reply was lost may have landed: pushing again would log a run that never was.
            if sent and runs.lpos(key, entry) is not None:
                return
            sent = True
            runs.rpush(key, entry)
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


@mcp_celery.tool(app, retry_on_worker_loss=True)
def chaos_retry(ctx: mcp_celery.JobContext, seconds: float) -> str:
    """At-least-once and idempotent: sleeps and says which task it was; runs again if its worker is lost."""
    record_run(ctx)
    ctx.sleep(seconds)
    return f"again {ctx.task_id}"


def _build(ctx: mcp_celery.JobContext, seconds: float) -> str:
    """The work a parking job does once: logged, cancellable, and named by the process that did it."""
    record_run(ctx, ONCE_KEY)
    ctx.sleep(seconds)
    return f"built-{os.getpid()}"


def _park(ctx: mcp_celery.JobContext, work_s: float, questions: int) -> str:
    """Work once (`ctx.once`), then ask `questions` questions; says which task, which build and what answers."""
    record_run(ctx)
    built = ctx.once("build", lambda: _build(ctx, work_s))
    values = []
    for number in range(questions):
        answer = ctx.elicit(f"Value {number + 1}?", VALUE, timeout=600)
        values.append(str((answer.content or {}).get("value")))
    return f"{ctx.task_id}:{built}:{'+'.join(values)}"


@mcp_celery.tool(app, task_mode="required", park_after_s=0)
def chaos_park(ctx: mcp_celery.JobContext, work_s: float, questions: int = 1) -> str:
    """Parks at each question at once; the answer runs it again from the top."""
    return _park(ctx, work_s, questions)


@mcp_celery.tool(app, task_mode="required", park_after_s=1)
def chaos_park_late(ctx: mcp_celery.JobContext, work_s: float, questions: int = 1) -> str:
    """Waits 1 s in its process for each answer, then parks."""
    return _park(ctx, work_s, questions)


@mcp_celery.tool(app, task_mode="required", park_after_s=0.5, retry_on_worker_loss=True)
def chaos_park_retry(ctx: mcp_celery.JobContext, work_s: float, questions: int = 1) -> str:
    """At-least-once, and parks after 0.5 s at each question."""
    return _park(ctx, work_s, questions)
