"""Every Celery signal the worker tier listens to, connected by one call.

Worker tier. The handlers live beside what they serve; this module only hooks them up, once per
process, when the worker tier is imported (`mcp_celery.worker` calls `connect`), which is before a
worker loads the app's task modules, sets up its logging or forks its pool:

- `worker_init`: check the Redis and the tools at start (`config`), route workflow members' bodies
  (`decorators`), and note the worker of a configured app for the shutdown grace (`shutdown`);
- `worker_shutting_down`: the shutdown grace period (`shutdown`);
- `task_failure`, `task_revoked`: store the outcome of a job that ended outside its run (`execution`);
- `after_setup_logger`, `after_setup_task_logger`: JSON log lines (`logsetup`).

Every handler returns at once for an app without MCP tools, so a process that imports mcp-celery
beside other Celery apps leaves them untouched.
"""

from __future__ import annotations

from celery import signals

from mcp_celery.worker.config import check_at_worker_start
from mcp_celery.worker.decorators import follow_members_at_worker_start
from mcp_celery.worker.execution import failed_outside_the_job, revoked_outside_the_job
from mcp_celery.worker.logsetup import json_lines
from mcp_celery.worker.shutdown import GRACE

__all__ = ["connect"]

_connected = False


def connect() -> None:
    """Connect every handler to its Celery signal; a second call does nothing."""
    global _connected
    if _connected:
        return
    _connected = True
    signals.worker_init.connect(check_at_worker_start, weak=False)
    signals.worker_init.connect(follow_members_at_worker_start, weak=False)
    signals.worker_init.connect(GRACE.on_worker_init, weak=False)
    signals.worker_shutting_down.connect(GRACE.on_shutting_down, weak=False)
    signals.task_failure.connect(failed_outside_the_job, weak=False)
    signals.task_revoked.connect(revoked_outside_the_job, weak=False)
    signals.after_setup_logger.connect(json_lines, weak=False)
    signals.after_setup_task_logger.connect(json_lines, weak=False)
