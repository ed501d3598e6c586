"""Jobs that ask for approval (`JobContext.approve`), on an app of their own.

Its broker and results are APPROVAL_BROKER_URL and APPROVAL_BACKEND_URL (a private Redis of the
approval tests), its queue `approvals`, so that a worker at `-c 1` serves only these. Every question
parks at once (`park_after_s=0`).
"""

from __future__ import annotations

import os

from celery import Celery

import jobs.release
import mcp_celery

BROKER = os.environ.get("APPROVAL_BROKER_URL", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("APPROVAL_BACKEND_URL", "redis://127.0.0.1:6379/1")
QUEUE = "approvals"

app = Celery("approval_jobs", broker=BROKER, backend=BACKEND)
app.conf.task_default_queue = QUEUE
mcp_celery.configure_app(app)
jobs.release.register(app, park_after_s=0)


@mcp_celery.tool(app, park_after_s=0)
def hold(ctx: mcp_celery.JobContext, n: int, approvers: list[str] | None = None, four_eyes: bool = False) -> str:
    """Ask for approval of item n; answers with the decision."""
    return str(ctx.approve(f"Hold #{n}?", approvers=approvers, four_eyes=four_eyes, details={"n": n}))


@mcp_celery.tool(app)
def quick(x: int) -> int:
    """A job without a question."""
    return x * 2
