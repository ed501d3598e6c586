"""The Celery settings long MCP jobs need, and the worker side's binding to each app.

Worker tier: celery and redis, never `mcp`.
"""

from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

import redis
from celery import Celery, signals

from mcp_celery.binding import DEFAULT_MAX_JOB_S, AppBinding
from mcp_celery.errors import ConfigurationError
from mcp_celery.settings import Settings
from mcp_celery.store.sync import SyncStore
from mcp_celery.tools import registry

__all__ = ["DEFAULT_MAX_JOB", "WorkerBinding", "configure_app", "worker_binding"]

logger = logging.getLogger(__name__)

#: Longest job the recommended configuration expects; also its hard time limit.
DEFAULT_MAX_JOB = timedelta(seconds=DEFAULT_MAX_JOB_S)


def configure_app(app: Celery, *, max_job: timedelta | None = None) -> None:
    """Apply the Celery settings long MCP jobs need (at-most-once delivery, visible states).

    `max_job` (default: MCP_CELERY_MAX_JOB_S, else 6 h) is the one setting for the longest job:
    it becomes Celery's hard time limit and, through it, the life of a running task's record,
    so a record can never expire before the job that owns it is stopped.

    Acks early and no prefetch, so the Redis visibility timeout can never run a long job
    twice; STARTED is tracked for Celery's own callers and task events are sent (Flower shows
    custom states through them); messages and results are JSON only (a pickle message is
    rejected, never executed). Call it before your own `app.conf` changes if you want to
    override any of these.

    Per broker: with Redis, the visibility timeout is twice the longest job (set in every place
    Celery's Redis documentation names). With RabbitMQ nothing broker-side is set: a job is acked
    when it starts, so RabbitMQ's consumer_timeout never applies to it.

    Tools with `retry_on_worker_loss=True` ack late instead. For them, the visibility timeout
    must outlive any job, and a job whose connection to the broker drops is stopped rather than
    left running beside the copy the broker hands out again. With RabbitMQ, the broker's own
    `consumer_timeout` (default 30 min) must likewise exceed the longest at-least-once job:
    RabbitMQ closes the channel of a consumer that holds a message unacked for longer, and the
    job then runs again. That is broker configuration (rabbitmq.conf `consumer_timeout`, in ms),
    which no Celery setting can change; the worker logs a warning naming such tools at start.

    Celery's own result-backend writes retry through an outage of the backend (a Redis restart)
    rather than fail the job. A worker's SIGTERM gives running jobs MCP_CELERY_SHUTDOWN_GRACE_S to
    finish (worker/shutdown.py).
    """
    from mcp_celery.worker.shutdown import install_shutdown_grace  # it needs worker_binding, below

    install_shutdown_grace(app)
    if max_job is None:
        from_env = Settings().max_job_s
        max_job = DEFAULT_MAX_JOB if from_env is None else timedelta(seconds=from_env)
    seconds = int(max_job.total_seconds())
    app.conf.update(
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        task_track_started=True,
        result_extended=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_time_limit=seconds,
        broker_transport_options={**app.conf.broker_transport_options, "visibility_timeout": 2 * seconds},
        # Celery's Redis docs name these two places as well; this Celery reads the first only.
        result_backend_transport_options={
            **(app.conf.result_backend_transport_options or {}),
            "visibility_timeout": 2 * seconds,
        },
        visibility_timeout=2 * seconds,
        # Only late-ack jobs: on a broker connection loss their message goes back to the queue,
        # so the running copy is stopped instead of running on beside a redelivered one.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        # Celery's own writes to its result backend (STARTED just before a job runs, the result
        # after) wait out a Redis restart instead of failing the task with a ConnectionError:
        # up to 20 tries, backing off to 10 s apart (about the 2 minutes our outcome write waits).
        result_backend_always_retry=True,
        result_backend_max_retries=20,
        # JSON only, both ways: a pickle message published to the broker is refused, never
        # unpickled (unpickling runs code), and results are never read back as pickle.
        accept_content=["json"],
        result_accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
    )


@dataclass
class WorkerBinding:
    """The worker side's binding to one app: settings, key names, lifetimes and a blocking store."""

    binding: AppBinding

    @property
    def settings(self) -> Settings:
        return self.binding.settings

    @cached_property
    def store(self) -> SyncStore:
        # No socket timeout: a job blocks on BLPOP for as long as its input wait lasts.
        client = redis.Redis.from_url(self.binding.redis_url, socket_timeout=None)
        return SyncStore(client, self.binding.keys, self.binding.lifetimes)


_BINDINGS: weakref.WeakKeyDictionary[Celery, WorkerBinding] = weakref.WeakKeyDictionary()


@signals.worker_init.connect(weak=False)
def _check_at_worker_start(sender: Any = None, **_: Any) -> None:
    """A worker of an app with MCP tools stops at once, in one line, when mcp-celery has no Redis.

    With RabbitMQ it also names the late-acknowledging tools, whose delivery stays unacked for the
    whole run: RabbitMQ's consumer_timeout (a server setting) must outlast their longest job.
    """
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery) or not registry(app):
        return
    try:
        binding = worker_binding(app)
    except ConfigurationError as exc:
        print(f"mcp-celery: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    late = sorted(spec.name for spec in registry(app).values() if getattr(spec.celery_task, "acks_late", False))
    if late and str(app.conf.broker_url or "").startswith(("amqp", "pyamqp")):
        logger.warning(
            "tools %s acknowledge late: set RabbitMQ's consumer_timeout above their longest job (%d s), "
            "or RabbitMQ redelivers them while they run",
            ", ".join(late),
            binding.binding.lifetimes.max_job_s,
        )


def worker_binding(app: Celery) -> WorkerBinding:
    """The app's worker binding, built on first use (reading MCP_CELERY_* then)."""
    found = _BINDINGS.get(app)
    if found is None:
        found = _BINDINGS[app] = WorkerBinding(AppBinding.create(app, Settings()))
    return found
