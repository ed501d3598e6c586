"""What the task service tells operators of a task's changes: spans, log lines, counts.

Server tier. One call beside the creation, so the service's own code stays about tasks.
"""

from __future__ import annotations

import logging

from mcp_celery import logs, tracing
from mcp_celery.server.ops import metrics

__all__ = ["cancel_requested", "created", "repeated", "resumed", "settled"]

logger = logging.getLogger("mcp_celery.server.engine.service")  # the lines read as the service's, as before


def created(task_id: str, tool: str, owner: str | None) -> None:
    """The task exists (record written, job queued, replicas confirmed): on the request's span, in the log
    (hashed principal, no arguments), and in `mcp_celery_tasks_created_total`."""
    tracing.annotate(task_id, tool, "working")
    if logger.isEnabledFor(logging.INFO):  # the principal's digest costs a hash: not for a line nobody keeps
        fields = logs.task_fields(task_id, tool, principal=owner, status="working", event="created")
        logger.info("task %s: created", task_id, extra=fields)
    metrics.record_created(tool)


def repeated(task_id: str, tool: str, owner: str | None, idempotency_key: str | None) -> None:
    """A call got the task of an earlier one (`mcp_celery.server.engine.repeats`): the same idempotency key
    (logged as its digest), else the same call within the tool's dedupe window; nothing was created."""
    by = "window" if idempotency_key is None else "key"
    fields = logs.task_fields(task_id, tool, principal=owner, event="repeated", idempotency_key=idempotency_key)
    logger.info("task %s: the call repeats an earlier one (same %s); no new task", task_id, by, extra=fields)
    metrics.record_deduplicated(tool, by)


def settled(task_id: str, tool: str, owner: str | None, status: str, message: str | None) -> None:
    """A read found the task ended (its end frozen by this server: a lost worker, a grace run out)."""
    fields = logs.task_fields(task_id, tool, principal=owner, status=status, event="ended")
    logger.info("task %s: %s (%s)", task_id, status, message, extra=fields)


def cancel_requested(task_id: str, tool: str | None, outcome: str) -> None:
    """A cancel was recorded: `unstarted` and `parked` end the task at once; a started job ends when it stops."""
    status = "cancelled" if outcome in ("unstarted", "parked") else None
    fields = logs.task_fields(task_id, tool, status=status, event="cancel")
    logger.info("task %s: cancel requested (%s)", task_id, outcome, extra=fields)


def resumed(task_id: str, tool: str, owner: str | None) -> None:
    """A parked job's last open question was answered and its message sent again (`mcp_celery.worker.parking`)."""
    fields = logs.task_fields(task_id, tool, principal=owner, status="working", event="resumed")
    logger.info("task %s: answered while parked; the job runs again", task_id, extra=fields)
