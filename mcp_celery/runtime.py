"""Per-app wiring shared by the worker and the server: settings, key names, TTL, Redis location.

The task record lives in the same Redis database as Celery's result meta, so that the
server reads both in one round trip; that is why the result backend must be Redis.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis
from celery import Celery
from celery.backends.redis import RedisBackend

from mcp_celery.errors import ConfigurationError
from mcp_celery.keys import Keys
from mcp_celery.settings import Settings
from mcp_celery.store import SyncStore

__all__ = ["Runtime", "now_ms", "runtime"]

MIN_TTL_S = 60


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Runtime:
    app: Celery
    settings: Settings

    def __post_init__(self) -> None:
        if not isinstance(self.app.backend, RedisBackend):
            raise ConfigurationError(
                f"Celery app {self.app.main!r} has result backend {type(self.app.backend).__name__}; mcp-celery "
                "needs a Redis result backend (e.g. Celery(..., backend='redis://127.0.0.1:6379/0'))"
            )
        expires = self._expires
        if expires and expires < MIN_TTL_S:
            raise ConfigurationError(
                f"result_expires is {expires} s; MCP tasks must stay readable for at least {MIN_TTL_S} s, "
                "so set result_expires to 60 or more (or None to keep results for ever)"
            )

    @property
    def _expires(self) -> float | None:
        """Celery's result_expires in seconds, as its backend applies it (None: never)."""
        expires: float | None = getattr(self.app.backend, "expires", None)
        return expires

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.key_prefix)

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url or str(self.app.conf.result_backend)

    @property
    def ttl_s(self) -> int | None:
        """How long a finished task stays readable: Celery's result_expires (None: for ever)."""
        expires = self._expires
        return int(expires) if expires else None

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl_s is None else self.ttl_s * 1000

    @property
    def keep_s(self) -> int:
        """Lifetime of a record that has not finished yet: TTL plus the longest job, so it never expires first."""
        return (self.ttl_s or 365 * 86400) + self.settings.max_job_s

    def meta_key(self, task_id: str) -> Any:
        return self.app.backend.get_key_for_task(task_id)  # type: ignore[attr-defined]

    def pending_meta(self, task_id: str) -> Any:
        meta: dict[str, Any] = {
            "status": "PENDING",
            "result": None,
            "traceback": None,
            "children": [],
            "date_done": None,
        }
        return self.app.backend.encode({**meta, "task_id": task_id})

    def decode_meta(self, raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        decoded = self.app.backend.decode(raw)
        return decoded if isinstance(decoded, dict) else None

    @cached_property
    def sync_store(self) -> SyncStore:
        # No socket timeout: a job blocks on BLPOP for as long as its input wait lasts.
        client = redis.Redis.from_url(self.redis_url, socket_timeout=None)
        return SyncStore(client, self.keys, self.meta_key)


_RUNTIMES: weakref.WeakKeyDictionary[Celery, Runtime] = weakref.WeakKeyDictionary()


def runtime(app: Celery, settings: Settings | None = None) -> Runtime:
    """The app's runtime, built on first use (reading MCP_CELERY_* then) unless `settings` is given."""
    current = _RUNTIMES.get(app)
    if current is None or settings is not None:
        current = _RUNTIMES[app] = Runtime(app, settings or Settings())
    return current
