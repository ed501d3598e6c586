"""Jobs for the result-backend tests: one app whose Celery result backend the test chooses.

BACKEND_JOBS_RESULT_BACKEND is Celery's result backend (a database URL, or empty for none);
mcp-celery's own state is in MCP_CELERY_REDIS_URL. The queue is its own, so that the suite's
main worker (same broker) never takes these jobs.
"""

from __future__ import annotations

import os

from celery import Celery, Task

import mcp_celery
from mcp_celery import JobContext

QUEUE = "backend-jobs"
CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}

app = Celery(
    "backend_jobs",
    broker=os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/12"),
    backend=os.environ.get("BACKEND_JOBS_RESULT_BACKEND") or None,
)
mcp_celery.configure_app(app)
app.conf.task_default_queue = QUEUE


@mcp_celery.tool(app)
def double(n: int) -> int:
    """Twice n."""
    return 2 * n


@mcp_celery.tool(app)
def refuse(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@mcp_celery.tool(app, task_mode="required")
def confirm(ctx: JobContext) -> str:
    """Asks a yes/no question."""
    answer = ctx.elicit("Go ahead?", CONFIRM)
    return "yes" if answer.content and answer.content.get("confirm") else "no"


@app.task(bind=True)
def count(self: Task, n: int, hold_s: float) -> int:  # type: ignore[type-arg]
    """An ordinary Celery task reporting progress the Celery way, then holding (cancellable)."""
    for i in range(n):
        self.update_state(state="PROGRESS", meta={"current": i + 1, "total": n})
    ctx = mcp_celery.current_context()
    if ctx is not None and ctx.attached:
        ctx.sleep(hold_s)
    return n


@app.task
def add(x: int, y: int) -> int:
    """An ordinary Celery task that other code also calls the Celery way."""
    return x + y


mcp_celery.expose(count)
mcp_celery.expose(add)
