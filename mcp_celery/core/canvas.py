"""What Celery must be told when no worker will tell it: a workflow's member headers and merge launch,
a parked job's REVOKED. Used by the worker and the server alike.

Tier 1 (celery types, no Redis). A workflow's members carry the MCP task's id in a message header;
its merge step is launched once its members end, by the worker that ends the last member or by a
server that finds them ended (a lost worker), whichever claims the launch first
(`mcp_celery.core.workflows`, FIELD.MERGING). A job parked at a question runs in no worker: when it
is cancelled, whoever cancels it writes Celery's REVOKED, as a worker would have.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Celery

from mcp_celery.core.workflows import Workflow

__all__ = ["FAILED_HEADER", "PARENT_HEADER", "launch_merge", "show_revoked"]

logger = logging.getLogger(__name__)

#: The message header that makes a Celery task a workflow member: the MCP task's id.
PARENT_HEADER = "mcp_celery_parent"
#: The merge step's header: the members that failed (JSON), for `JobContext.failed_members`.
FAILED_HEADER = "mcp_celery_failed"


def launch_merge(app: Celery, parent_id: str, workflow: Workflow, results: list[Any], failed: list[Any]) -> None:
    """Send the merge step with the members' results (its record exists; the caller claimed the launch)."""
    if workflow.merge is None or workflow.merge_signature is None:
        raise ValueError("the workflow has no merge step")
    merge = app.signature(workflow.merge_signature)
    headers = {**(merge.options.get("headers") or {}), PARENT_HEADER: parent_id, FAILED_HEADER: json.dumps(failed)}
    logger.info("task %s: its members ended; launching the merge step %s", parent_id, workflow.merge.id)
    merge.apply_async(
        args=(results,), task_id=workflow.merge.id, headers=headers, parent_id=parent_id, root_id=parent_id
    )


def show_revoked(app: Celery, task_id: str, reason: str) -> None:
    """Celery's REVOKED for a cancelled parked job, in its result backend and as Flower's event, as a worker would.

    Never raises: the cancel itself is recorded already; only Celery's own view lags (logged).
    """
    try:
        app.backend.mark_as_revoked(task_id, reason=reason)
        with app.events.default_dispatcher() as dispatcher:
            fields = {"terminated": False, "expired": False, "reason": reason, "state": "REVOKED"}
            dispatcher.send("task-revoked", uuid=task_id, **fields)
    except Exception:  # noqa: BLE001
        logger.warning("task %s: could not show its parked job's cancel in Celery's backend", task_id, exc_info=True)
