"""A tool's Celery options that follow the app's configuration, settled again whenever it may have changed.

Tier 1 (celery). Celery copies some settings into a task when the task is defined (`Task.bind`):
`task_time_limit`, `task_acks_late`, `task_serializer` (and `task_track_started`, which a tool never
follows: its record shows the job running, so it does not store Celery's STARTED). A tool decorated
before `configure_app` would keep the values from before it, and get no soft time limit. So each
tool made with `mcp_celery.tool` remembers which Celery options it was given (`ToolSpec.given`),
and the others are settled from the app's configuration again by `configure_app`, at worker start
and when a server is built: the order of `configure_app` and the decorators does not matter.
Exposed tasks (`mcp_celery.expose`) are the user's own Celery tasks and keep what Celery gave them.

An at-least-once tool's hard time limit must be shorter than a Redis broker's visibility timeout.
That is checked when the tool is defined on an app `configure_app` has already configured, else
when `configure_app` runs, and in any case at worker start and when a server is built.
"""

from __future__ import annotations

import weakref

from celery import Celery

from mcp_celery.core.tools import ToolSpec, registry
from mcp_celery.errors import ToolDefinitionError

__all__ = [
    "check_delivery",
    "configured",
    "mark_configured",
    "settle",
    "settle_tool",
    "soft_time_limit",
    "tool_defined",
]

#: Task attributes Celery copies from these settings when a task is defined, among those configure_app sets.
FROM_CONFIG = (
    ("time_limit", "task_time_limit"),
    ("acks_late", "task_acks_late"),
    ("serializer", "task_serializer"),
)
#: kombu's visibility timeout when the broker transport options name none.
KOMBU_VISIBILITY_TIMEOUT_S = 3600
_REDIS_BROKERS = ("redis", "rediss", "sentinel")

_CONFIGURED: weakref.WeakSet[Celery] = weakref.WeakSet()


def soft_time_limit(hard_s: float) -> float:
    """When a tool is told to stop: a minute before its hard limit, or at 90% of a short one."""
    return max(hard_s - 60, hard_s * 0.9)


def mark_configured(app: Celery) -> None:
    """`configure_app` has run on `app`: tools defined from now on are checked at once."""
    _CONFIGURED.add(app)


def configured(app: Celery) -> bool:
    """Whether `configure_app` has run on `app`."""
    return app in _CONFIGURED


def tool_defined(spec: ToolSpec) -> None:
    """Settle a new tool's options; on an app `configure_app` has configured, check its delivery at once.

    Raises:
        ToolDefinitionError: see `check_delivery`.
    """
    settle_tool(spec)
    if configured(spec.celery_task.app):
        check_delivery(spec)


def settle(app: Celery) -> None:
    """Settle every tool of `app` from its configuration as it is now, then check each one's delivery.

    Raises:
        ToolDefinitionError: see `check_delivery`.
    """
    for spec in registry(app).values():
        settle_tool(spec)
        check_delivery(spec)


def settle_tool(spec: ToolSpec) -> None:
    """Set the Celery options the tool was not given from its app's configuration as it is now."""
    if spec.given is None:
        return  # an exposed task: the user's own, as Celery made it
    task = spec.celery_task
    conf = task.app.conf
    for attribute, setting in FROM_CONFIG:
        if attribute not in spec.given:
            setattr(task, attribute, conf[setting])
    if "soft_time_limit" not in spec.given:
        # Told to stop before it is killed: the job may catch SoftTimeLimitExceeded and clean up.
        hard = task.time_limit
        soft = soft_time_limit(float(hard)) if hard else conf.task_soft_time_limit
        setattr(task, "soft_time_limit", soft)  # noqa: B010  (celery-types says int; Celery takes any number)


def check_delivery(spec: ToolSpec) -> None:
    """An at-least-once tool on a Redis broker needs a hard time limit below the visibility timeout.

    With a Redis broker, a message not acked within the visibility timeout is handed to another
    worker, running job or not. A lost job is re-queued well before then by the server
    (`mcp_celery.server.engine.reaper`); RabbitMQ redelivers when the worker's channel closes instead.

    Raises:
        ToolDefinitionError: the tool is at-least-once and its hard limit is missing or too long.
    """
    task = spec.celery_task
    app = task.app
    if not spec.redelivered_on_loss or not str(app.conf.broker_url or "").startswith(_REDIS_BROKERS):
        return
    timeout = (app.conf.broker_transport_options or {}).get("visibility_timeout", KOMBU_VISIBILITY_TIMEOUT_S)
    limit = task.time_limit or app.conf.task_time_limit
    if not limit or limit >= timeout:
        raise ToolDefinitionError(
            f"tool {spec.name!r}: retry_on_worker_loss needs a hard time limit (now {limit}) shorter than the "
            f"broker's visibility timeout ({timeout} s), or Redis would hand the running job to a second "
            "worker; configure_app(app, max_job=...) sets both"
        )
