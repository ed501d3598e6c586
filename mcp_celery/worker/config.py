"""The Celery settings long MCP jobs need, and the worker side's binding to each app.

Worker tier: celery and redis, never `mcp`.
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

from celery import Celery

from mcp_celery import logs
from mcp_celery.core.binding import AppBinding, max_job_s, queues_readable
from mcp_celery.core.task_options import configured, mark_configured, settle
from mcp_celery.core.tools import registry
from mcp_celery.errors import McpCeleryError
from mcp_celery.settings import Settings
from mcp_celery.store.artifact_files import check_store
from mcp_celery.store.connect import sync_client
from mcp_celery.store.probe import RedisUnreachable, probe
from mcp_celery.store.sync import SyncStore
from mcp_celery.worker.serializers import JSON_ONLY, remember_replaced, warn_about_refused_serializers

__all__ = ["WorkerBinding", "configure_app", "recommended_settings", "worker_binding", "worker_settings"]

logger = logging.getLogger(__name__)

#: The longest one Redis call of the worker's main process may wait (a hung Redis must not stall it).
MAIN_PROCESS_REDIS_TIMEOUT_S = 2.0


def configure_app(app: Celery, *, max_job: timedelta | None = None) -> None:
    """Apply the Celery settings long MCP jobs need (at-most-once delivery, visible states).

    `max_job` (default: MCP_CELERY_MAX_JOB_S, else the app's own task_time_limit, else 6 h) is
    the one setting for the longest job: it becomes Celery's hard time limit and, through it, the
    life of a running task's record, so a record can never expire before the job that owns it is
    stopped. `recommended_settings` lists every setting this applies.

    Acks early and no prefetch, so the Redis visibility timeout can never run a long job
    twice; STARTED is tracked for Celery's own callers (tools made with `tool` do not store it in
    Celery's backend: their task record and the task-started event show it) and task events are
    sent (Flower shows custom states through them); messages and results are JSON only (a pickle
    message is rejected, never executed). Call it before your own `app.conf` changes if you want to
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
    finish (worker/shutdown.py; a worker of a configured app).

    It may be called before or after the `@tool` decorators: tools already defined are settled
    again from the new configuration (`mcp_celery.core.task_options`). A worker of an app that used
    pickle before logs a warning at start naming the settings this replaced.

    Args:
        app: the Celery app to configure.
        max_job: the longest job (default: MCP_CELERY_MAX_JOB_S, else the app's task_time_limit, else 6 h).

    Raises:
        ToolDefinitionError: a `retry_on_worker_loss` tool already defined has a hard time limit
            that is not below the visibility timeout this sets.
    """
    remember_replaced(app)  # a pickle setup this replaces is named in a warning at worker start
    app.conf.update(recommended_settings(app, max_job))
    mark_configured(app)
    settle(app)  # tools decorated before this call follow it too


def recommended_settings(app: Celery, max_job: timedelta | None = None) -> dict[str, Any]:
    """The Celery settings `configure_app` applies to `app`, by name (nothing is changed here).

    Args:
        app: the app whose transport options are extended (its other options are kept).
        max_job: the longest job; default: MCP_CELERY_MAX_JOB_S, else the app's own
            task_time_limit, else 6 h.
    """
    seconds = max_job_s(app, worker_settings()) if max_job is None else int(max_job.total_seconds())
    return {
        "task_acks_late": False,
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": True,
        "task_track_started": True,
        "result_extended": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_time_limit": seconds,
        "broker_transport_options": {**app.conf.broker_transport_options, "visibility_timeout": 2 * seconds},
        # Celery's Redis docs name these two places as well; this Celery reads the first only.
        "result_backend_transport_options": {
            **(app.conf.result_backend_transport_options or {}),
            "visibility_timeout": 2 * seconds,
        },
        "visibility_timeout": 2 * seconds,
        # Only late-ack jobs: on a broker connection loss their message goes back to the queue,
        # so the running copy is stopped instead of running on beside a redelivered one.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        # Celery's own writes to its result backend (STARTED just before a job runs, the result
        # after) wait out a Redis restart instead of failing the task with a ConnectionError:
        # up to 20 tries, backing off to 10 s apart (about the 2 minutes our outcome write waits).
        "result_backend_always_retry": True,
        "result_backend_max_retries": 20,
        # JSON only, both ways: a pickle message published to the broker is refused, never
        # unpickled (unpickling runs code), and results are never read back as pickle.
        **JSON_ONLY,
    }


@dataclass
class WorkerBinding:
    """The worker side's binding to one app: settings, key names, lifetimes and a blocking store."""

    binding: AppBinding

    @property
    def settings(self) -> Settings:
        return self.binding.settings

    @cached_property
    def queue_check_s(self) -> float | None:
        """How long servers wait between looks for an unstarted job's message (None: they cannot look
        into this broker's queues). Once per process, as the rest of the binding: every job asks."""
        return self.settings.queue_check_s if queues_readable(self.binding.app) else None

    @cached_property
    def store(self) -> SyncStore:
        """The store of running jobs: no socket timeout, since a job blocks on BLPOP while it waits for input.

        One retry on a broken connection (a Redis restart leaves stale ones): the store's own loops wait
        out a longer outage, and try again the moment Redis is back.
        """
        client = sync_client(self.binding.redis, socket_timeout=None, retries=1)
        return SyncStore(client, self.binding.keys, self.binding.lifetimes, self.binding.durability)

    @cached_property
    def main_process_store(self) -> SyncStore:
        """The store of the worker's main process (marks before an ack, outcomes it stores for a lost job).

        Its calls never block, so a socket timeout bounds them, and they are not retried: a Redis that
        hangs (rather than refusing connections) must not stall the loop that acks messages and answers
        control commands for longer than that. Nor do they wait for replicas (MCP_CELERY_REDIS_MIN_REPLICAS),
        which would hold that loop up to their bounded wait.
        """
        client = sync_client(
            self.binding.redis,
            socket_timeout=MAIN_PROCESS_REDIS_TIMEOUT_S,
            connect_timeout=MAIN_PROCESS_REDIS_TIMEOUT_S,
            retries=0,
        )
        return SyncStore(client, self.binding.keys, self.binding.lifetimes)


_BINDINGS: weakref.WeakKeyDictionary[Celery, WorkerBinding] = weakref.WeakKeyDictionary()


def check_at_worker_start(sender: Any = None, **_: Any) -> None:
    """A worker of an app with MCP tools stops at once, in one line, when mcp-celery has no usable Redis,
    or cannot write where MCP_CELERY_ARTIFACTS keeps artifacts.

    No Redis configured, a URL that cannot work, and a Redis that refuses us (TLS, credentials,
    ACL, a cluster older than Redis 7) stop it; a Redis that is just not answering yet only gets a
    warning, since jobs wait for it (a restart, a failover) as they run.

    It settles the tools' options from the app's configuration as the worker runs it (so does a
    tool whose hard limit outlasts the visibility timeout stop it), warns about tasks whose
    serialization the worker refuses (`mcp_celery.worker.serializers`), and with RabbitMQ names
    the late-acknowledging tools, whose delivery stays unacked for the whole run: RabbitMQ's
    consumer_timeout (a server setting) must outlast their longest job.
    """
    app = getattr(sender, "app", None)
    if not isinstance(app, Celery) or not (registry(app) or configured(app)):
        return  # not an app of ours
    warn_about_refused_serializers(app)
    if not registry(app):
        return
    try:
        settle(app)  # the configuration as this worker runs it, whatever the order of definitions
        binding = worker_binding(app)
        _check_redis(binding.binding)
        check_store(binding.settings.artifacts, binding.binding.keys.prefix)  # a bucket, its credentials
        # Servers say theirs at start too: a job created in another store is refused, naming both.
        logs.announce(f"task store {binding.binding.described}")
    except McpCeleryError as exc:
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


def _check_redis(binding: AppBinding) -> None:
    """Raise for a Redis that refuses us; only warn for one that does not answer (yet)."""
    try:
        probe(binding.redis, timeout_s=MAIN_PROCESS_REDIS_TIMEOUT_S)
    except RedisUnreachable as exc:
        logger.warning("%s; jobs wait for it", exc)


def worker_binding(app: Celery) -> WorkerBinding:
    """The app's worker binding, built on first use (reading MCP_CELERY_* then)."""
    found = _BINDINGS.get(app)
    if found is None:
        found = _BINDINGS[app] = WorkerBinding(AppBinding.create(app, worker_settings()))
    return found


@functools.cache
def worker_settings() -> Settings:
    """The worker side's settings: read from the environment once per process, on first use (`configure_app`,
    the first job, the log set-up), and shared by every app's binding."""
    return Settings()
