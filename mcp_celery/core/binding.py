"""How mcp-celery binds to one Celery app: where its state lives, key names and lifetimes.

Tier 1 (celery types, no I/O). mcp-celery keeps each task's record in Redis: the server reads
it in one round trip for `tasks/get`, and the worker side writes the job's progress and
outcome into it, whatever Celery's result backend is (Redis, a database, or none). That Redis
is MCP_CELERY_REDIS_URL, else the result backend's URL when the result backend is Redis (one
server, TLS or Celery's `sentinel://` with its `master_name` transport option). Both sides build an
`AppBinding` from the app and the settings: the worker once per process (`mcp_celery.worker`), the
server once per `create_server`; every Redis client comes from its `redis` target
(`mcp_celery.store.connect`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

from celery import Celery, Task

from mcp_celery.errors import ConfigurationError
from mcp_celery.settings import Settings
from mcp_celery.store.connect import RedisTarget, redis_target
from mcp_celery.store.schema import Durability, Keys, Lifetimes

__all__ = [
    "DEFAULT_MAX_JOB_S",
    "MIN_TTL_S",
    "QUEUE_READABLE_SCHEMES",
    "STORE_HEADER",
    "AppBinding",
    "broker_url",
    "max_job_s",
    "queue_of",
    "queues_readable",
    "redis_url",
    "result_expires_s",
    "store_identity",
    "store_target",
]

MIN_TTL_S = 60
#: The longest job when neither MCP_CELERY_MAX_JOB_S nor a Celery hard time limit says otherwise.
DEFAULT_MAX_JOB_S = 6 * 3600

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")
#: The header of a job's Celery message that names the store its task was created in (`store_identity`).
STORE_HEADER = "mcp_celery_store"
# What a store's identity leaves out of its URL: `user:password@` and a password or user in the query.
_CREDENTIALS = re.compile(r"(?<=://)[^@/]*@|(?<=[?&;])(?:password|username)=[^&;]*")


def redis_url(app: Celery, settings: Settings) -> str:
    """Where mcp-celery keeps its state: MCP_CELERY_REDIS_URL, else a Redis result backend's URL.

    Raises:
        ConfigurationError: neither is set (the one line says what to set).
    """
    if settings.redis_url:
        return settings.redis_url
    backend = app.conf.result_backend
    if isinstance(backend, str) and backend.startswith(_REDIS_SCHEMES):
        return backend
    described = "none" if not backend else str(backend).split("://", 1)[0] + "://..."
    raise ConfigurationError(
        f"no Redis for task state: set MCP_CELERY_REDIS_URL (e.g. redis://127.0.0.1:6379/0); "
        f"Celery app {app.main!r} has result backend {described}, which is not Redis"
    )


def store_target(app: Celery, settings: Settings) -> RedisTarget:
    """The Redis of `redis_url`, checked, with the Sentinel master's name when it is a sentinel:// URL.

    Raises:
        ConfigurationError: no Redis, or a URL that cannot work (the one line says what to set).
    """
    url = redis_url(app, settings)
    options = app.conf.result_backend_transport_options or {}
    backend_url = isinstance(app.conf.result_backend, str) and url == app.conf.result_backend
    return redis_target(
        url,
        master_name=settings.redis_master_name or options.get("master_name"),
        # The sentinels' own options (a password, say) are the result backend's, when it is the same Redis.
        sentinel_kwargs=options.get("sentinel_kwargs") if backend_url else None,
        setting="MCP_CELERY_REDIS_URL" if settings.redis_url else "the Celery result backend",
    )


def store_identity(target: RedisTarget, key_prefix: str) -> str:
    """Which store a process uses, as `PREFIX@DIGEST`: its key prefix and a digest of its address (the URL
    without credentials, and a Sentinel master's name), never a secret.

    A job's message carries its server's (`STORE_HEADER`): a worker whose own differs, and that finds no
    record of the task, refuses the job (`mcp_celery.worker.execution`). Two spellings of one address
    (localhost, 127.0.0.1) differ here; that is harmless, since a worker that finds the record runs the job.
    """
    address = f"{_CREDENTIALS.sub('', target.url)}#{target.master_name}"
    return f"{key_prefix}@{hashlib.sha256(address.encode()).hexdigest()[:12]}"


#: The broker URLs whose queues servers look into for lost messages (`mcp_celery.server.engine.reaper`).
QUEUE_READABLE_SCHEMES = ("redis://", "rediss://", "sentinel://")


def broker_url(app: Celery) -> str:
    """The URL the app's workers consume from (Celery's read URL, else its broker URL)."""
    return str(app.conf.broker_read_url or app.conf.broker_url or "").strip()


def queues_readable(app: Celery) -> bool:
    """Whether servers look into the app's broker queues (a Redis broker): a task whose job has not
    started is then watched from its creation, and a message lost before any worker took it is seen."""
    return broker_url(app).startswith(QUEUE_READABLE_SCHEMES)


def queue_of(celery_task: Task[Any, Any]) -> str:
    """The queue Celery routes the task's messages to, as `apply_async` does (its options, then the router)."""
    task: Any = celery_task
    return str(task.app.amqp.router.route(task._get_exec_options(), task.name, task_type=task)["queue"].name)


def result_expires_s(app: Celery) -> int | None:
    """Celery's result_expires in seconds (None: results are kept for ever)."""
    expires = app.conf.result_expires
    if isinstance(expires, timedelta):
        expires = expires.total_seconds()
    return int(expires) if expires else None


def max_job_s(app: Celery, settings: Settings) -> int:
    """The longest a job of `app` may run: MCP_CELERY_MAX_JOB_S, else Celery's hard time limit, else 6 h."""
    if settings.max_job_s is not None:
        return settings.max_job_s
    limit = app.conf.task_time_limit
    return int(limit) if limit else DEFAULT_MAX_JOB_S


@dataclass(frozen=True)
class AppBinding:
    """Everything both sides need to serve one Celery app's tools."""

    app: Celery
    settings: Settings
    keys: Keys
    lifetimes: Lifetimes
    redis: RedisTarget
    durability: Durability

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @cached_property
    def identity(self) -> str:
        """This process's store as `store_identity` names it."""
        return store_identity(self.redis, self.keys.prefix)

    @property
    def described(self) -> str:
        """The store in words for the logs: its URL without the password, where it came from, its key prefix."""
        return f"{self.redis.shown} (from {self.redis.source}), key prefix {self.keys.prefix!r}, store {self.identity}"

    @classmethod
    def create(cls, app: Celery, settings: Settings) -> AppBinding:
        """Check that `app` can back MCP tasks and bind to it (no I/O: `store.connect.probe` connects).

        Raises:
            ConfigurationError: no Redis for mcp-celery's state, a Redis URL that cannot work, a cluster
                asked to confirm writes on replicas, or result_expires is too short.
        """
        target = store_target(app, settings)
        if settings.redis_min_replicas and target.topology == "cluster":
            raise ConfigurationError(
                "MCP_CELERY_REDIS_MIN_REPLICAS needs one Redis primary (plain or Sentinel), not a cluster: a "
                "cluster's writes are confirmed per node; unset it, or use min-replicas-to-write on the cluster"
            )
        ttl_s = result_expires_s(app)
        if ttl_s and ttl_s < MIN_TTL_S:
            raise ConfigurationError(
                f"result_expires is {ttl_s} s; MCP tasks must stay readable for at least {MIN_TTL_S} s, "
                "so set result_expires to 60 or more (or None to keep results for ever)"
            )
        return cls(
            app=app,
            settings=settings,
            keys=Keys(settings.key_prefix),
            lifetimes=Lifetimes(ttl_s, max_job_s(app, settings)),
            redis=target,
            durability=Durability(settings.redis_min_replicas, settings.redis_min_replicas_wait_ms),
        )
