"""How mcp-celery binds to one Celery app: where its state lives, key names and lifetimes.

Tier 1 (celery types, no I/O). mcp-celery keeps each task's record in Redis: the server reads
it in one round trip for `tasks/get`, and the worker side writes the job's progress and
outcome into it, whatever Celery's result backend is (Redis, a database, or none). That Redis
is MCP_CELERY_REDIS_URL, else the result backend's URL when the result backend is Redis. Both
sides build an `AppBinding` from the app and the settings: the worker once per process
(`mcp_celery.worker`), the server once per `create_server`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from celery import Celery

from mcp_celery.errors import ConfigurationError
from mcp_celery.settings import Settings
from mcp_celery.store.schema import Keys, Lifetimes

__all__ = ["DEFAULT_MAX_JOB_S", "MIN_TTL_S", "AppBinding", "max_job_s", "redis_url", "result_expires_s"]

MIN_TTL_S = 60
#: The longest job when neither MCP_CELERY_MAX_JOB_S nor a Celery hard time limit says otherwise.
DEFAULT_MAX_JOB_S = 6 * 3600

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


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
    redis_url: str

    @classmethod
    def create(cls, app: Celery, settings: Settings) -> AppBinding:
        """Check that `app` can back MCP tasks and bind to it.

        Raises:
            ConfigurationError: no Redis for mcp-celery's state, or result_expires is too short.
        """
        url = redis_url(app, settings)
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
            redis_url=url,
        )
