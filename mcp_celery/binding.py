"""How mcp-celery binds to one Celery app: its result backend, key names, lifetimes and Redis.

Tier 1 (celery types, no I/O). The task record lives in the same Redis database as Celery's
result meta, so that the server reads both in one round trip; that is why the result backend
must be Redis. Both sides build an `AppBinding` from the app and the settings: the worker once
per process (`mcp_celery.worker`), the server once per `create_server`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.backends.redis import RedisBackend

from mcp_celery.errors import ConfigurationError
from mcp_celery.settings import Settings
from mcp_celery.store.schema import Keys, Lifetimes

__all__ = ["DEFAULT_MAX_JOB_S", "MIN_TTL_S", "AppBinding", "ResultBackend", "max_job_s"]

MIN_TTL_S = 60
#: The longest job when neither MCP_CELERY_MAX_JOB_S nor a Celery hard time limit says otherwise.
DEFAULT_MAX_JOB_S = 6 * 3600

_PENDING_META: dict[str, Any] = {
    "status": "PENDING",
    "result": None,
    "traceback": None,
    "children": [],
    "date_done": None,
}


@dataclass(frozen=True)
class ResultBackend:
    """mcp-celery's view of the app's Celery result backend: where a task's meta lives, and its codec."""

    app: Celery

    @property
    def expires_s(self) -> int | None:
        """Celery's result_expires in seconds, as its backend applies it (None: never)."""
        expires: float | None = getattr(self.app.backend, "expires", None)
        return int(expires) if expires else None

    def meta_key(self, task_id: str) -> Any:
        return self.app.backend.get_key_for_task(task_id)  # type: ignore[attr-defined]

    def pending_meta(self, task_id: str) -> Any:
        return self.app.backend.encode({**_PENDING_META, "task_id": task_id})

    def decode(self, raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        decoded = self.app.backend.decode(raw)
        return decoded if isinstance(decoded, dict) else None


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
    backend: ResultBackend
    keys: Keys
    lifetimes: Lifetimes
    redis_url: str

    @classmethod
    def create(cls, app: Celery, settings: Settings) -> AppBinding:
        """Check that `app` can back MCP tasks and bind to it.

        Raises:
            ConfigurationError: the result backend is not Redis, or result_expires is too short.
        """
        if not isinstance(app.backend, RedisBackend):
            raise ConfigurationError(
                f"Celery app {app.main!r} has result backend {type(app.backend).__name__}; mcp-celery "
                "needs a Redis result backend (e.g. Celery(..., backend='redis://127.0.0.1:6379/0'))"
            )
        backend = ResultBackend(app)
        ttl_s = backend.expires_s
        if ttl_s and ttl_s < MIN_TTL_S:
            raise ConfigurationError(
                f"result_expires is {ttl_s} s; MCP tasks must stay readable for at least {MIN_TTL_S} s, "
                "so set result_expires to 60 or more (or None to keep results for ever)"
            )
        return cls(
            app=app,
            settings=settings,
            backend=backend,
            keys=Keys(settings.key_prefix),
            lifetimes=Lifetimes(ttl_s, max_job_s(app, settings)),
            redis_url=settings.redis_url or str(app.conf.result_backend),
        )
