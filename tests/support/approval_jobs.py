"""Jobs that ask for approval (`JobContext.approve`), on an app of their own.

Its broker and results are APPROVAL_BROKER_URL and APPROVAL_BACKEND_URL (a private Redis of the
approval tests). Its tools go to the queue `approvals`, except the `*_alone` ones, which go to
`approvals-alone`, so that a worker serving only that queue (at `-c 1`, or with settings of its
own) runs only them. Every question parks at once (`park_after_s=0`), but `hold_awake`'s, whose job waits.

The approval policy's tools (`approval_support.POLICY` holds their calls): `deploy_service`, a plain
Celery task exposed as it is, on a queue of its own (`GATED_QUEUE`, so a test sees what reaches it
before a worker takes it), counting its runs in Redis; `deploy_docs` and `restart_service`, made
with `tool`; `archive_logs`, held by nothing, on a queue no worker takes.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import jobs.release
import mcp_celery

BROKER = os.environ.get("APPROVAL_BROKER_URL", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("APPROVAL_BACKEND_URL", "redis://127.0.0.1:6379/1")
QUEUE, ALONE = "approvals", "approvals-alone"
GATED_QUEUE, NOWHERE_QUEUE = "gated", "nowhere"

app = Celery("approval_jobs", broker=BROKER, backend=BACKEND)
app.conf.task_default_queue = QUEUE
app.conf.task_routes = {
    "tests.support.approval_jobs.deploy_service": {"queue": GATED_QUEUE},
    "tests.support.approval_jobs.archive_logs": {"queue": NOWHERE_QUEUE},
    "*_alone": {"queue": ALONE},
}
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


def runs_key(service: str, env: str) -> str:
    """The Redis key (of BACKEND) that counts the runs of `deploy_service(service, env)`."""
    return f"policy-runs:{service}:{env}"


@app.task(name="tests.support.approval_jobs.deploy_service")
def deploy_service(service: str, env: str, api_token: str = "") -> str:
    """Deploy a service: a plain Celery task that knows nothing of MCP or approvals."""
    redis.Redis.from_url(BACKEND).incr(runs_key(service, env))
    return f"deployed {service} to {env}"


mcp_celery.expose(deploy_service)


@mcp_celery.tool(app)
def deploy_docs(service: str, env: str) -> str:
    """Deploy a service's documentation."""
    return f"docs of {service} deployed to {env}"


@mcp_celery.tool(app)
def restart_service(service: str) -> str:
    """Restart a service (its policy gives an approver seconds, for the timeout test)."""
    return f"restarted {service}"


@app.task(name="tests.support.approval_jobs.archive_logs")
def archive_logs(day: str) -> str:
    """Archive a day's logs (no policy; its queue has no worker, for the reaper test)."""
    return day


mcp_celery.expose(archive_logs)
