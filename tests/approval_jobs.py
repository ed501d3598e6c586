"""Jobs that ask for approval (`JobContext.approve`), on an app of their own.

Its broker and results are APPROVAL_BROKER_URL and APPROVAL_BACKEND_URL (a private Redis of the
approval tests). Its tools go to the queue `approvals`, except the `*_alone` ones, which go to
`approvals-alone`, so that a worker serving only that queue (at `-c 1`, or with settings of its
own) runs only them. Every question parks at once (`park_after_s=0`), but `hold_awake`'s, whose job waits.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import jobs.release
import mcp_celery

BROKER = os.environ.get("APPROVAL_BROKER_URL", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("APPROVAL_BACKEND_URL", "redis://127.0.0.1:6379/1")
QUEUE, ALONE = "approvals", "approvals-alone"

app = Celery("approval_jobs", broker=BROKER, backend=BACKEND)
app.conf.task_default_queue = QUEUE
app.conf.task_routes = {"*_alone": {"queue": ALONE}}
mcp_celery.configure_app(app)
jobs.release.register(app, park_after_s=0)


@mcp_celery.tool(app, park_after_s=0)
def hold(
    ctx: mcp_celery.JobContext,
    n: int,
    approvers: Any = None,
    four_eyes: bool | None = None,
    details: dict[str, Any] | None = None,
    timeout: float | None = None,
    message: str | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Ask for approval of item n; answers with the decision. `four_eyes` None: ctx.approve's default;
    `approvers` is passed as given (a str too, which ctx.approve refuses); `extra` is shown as an argument."""
    chosen = {} if four_eyes is None else {"four_eyes": four_eyes}
    asked = message or f"Hold #{n}?"
    decided = ctx.approve(asked, approvers=approvers, details=details or {"n": n}, timeout=timeout, **chosen)
    return str(decided)


@mcp_celery.tool(app, park_after_s=None)
def hold_awake(ctx: mcp_celery.JobContext, n: int, timeout: float) -> str:
    """Ask bob to approve item n within `timeout` seconds, the job waiting (never parked) for the decision."""
    return str(ctx.approve(f"Hold #{n}?", approvers=["bob"], details={"n": n}, timeout=timeout))


@mcp_celery.tool(app)
def quick(x: int) -> int:
    """A job without a question."""
    return x * 2


@mcp_celery.tool(app, park_after_s=0)
def hold_alone(ctx: mcp_celery.JobContext, n: int) -> str:
    """Ask bob to approve item n (on the queue `approvals-alone`)."""
    return str(ctx.approve(f"Hold #{n}?", approvers=["bob"], details={"n": n}))


@mcp_celery.tool(app)
def quick_alone(x: int) -> int:
    """A job without a question (on the queue `approvals-alone`)."""
    return x * 2
