"""Readiness: does the store's Redis answer, and the broker, each within a bounded time.

Server tier. `GET /readyz` asks both at once, each on a thread with a fresh connection (the
startup check of `mcp_celery.store.probe` for Redis, a kombu connection for any other broker), so
a readiness answer never waits behind the server's busy pools and never takes longer than the
timeout. What failed is named, without a URL, a host or a password: the probe's caller (a load
balancer, the kubelet) is not told where the Redis is. The server log says more, once per change.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
import redis
from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError

from mcp_celery.core.binding import store_target
from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import redact
from mcp_celery.server.engine.broker import broker_target
from mcp_celery.settings import Settings
from mcp_celery.store.probe import RedisUnreachable, probe

__all__ = ["FRESH_S", "Readiness", "Verdict"]

logger = logging.getLogger(__name__)

#: Seconds a readiness verdict is reused for.
FRESH_S = 1.0


@dataclass(frozen=True)
class Verdict:
    """What `/readyz` found: `failed` maps each check that failed (redis, broker) to why, in a few words."""

    failed: dict[str, str]

    @property
    def ready(self) -> bool:
        return not self.failed

    def body(self) -> dict[str, object]:
        if self.ready:
            return {"status": "ready"}
        return {"status": "not ready", "failed": self.failed}


class Readiness:
    """The readiness checks of one server: the store's Redis and the app's broker."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.timeout_s = settings.probe_timeout_s
        store = store_target(app, settings)
        broker = broker_target(app)
        self._checks: dict[str, Callable[[], None]] = {
            "redis": lambda: probe(store, timeout_s=self.timeout_s),
            "broker": (lambda: probe(broker, timeout_s=self.timeout_s)) if broker else lambda: self._kombu(app),
        }
        self._last: dict[str, str] = {}
        self._lock = anyio.Lock()
        self._verdict: Verdict | None = None
        self._checked_at = 0.0

    async def verdict(self) -> Verdict:
        """The checks' verdict, at most `FRESH_S` old: requests arriving meanwhile share one run of the
        checks, so a flood of `/readyz` (which needs no token) cannot open a flood of Redis connections."""
        async with self._lock:
            if self._verdict is None or time.monotonic() - self._checked_at >= FRESH_S:
                self._verdict = await self._check()
                self._checked_at = time.monotonic()
            return self._verdict

    async def _check(self) -> Verdict:
        """Run every check at once; one still running after the timeout counts as failed."""
        failed: dict[str, str] = {}

        async def run(name: str, check: Callable[[], None]) -> None:
            failed[name] = f"no answer within {self.timeout_s:g} s"
            with anyio.move_on_after(self.timeout_s + 0.25):  # the socket timeouts end it sooner, as a rule
                reason = await anyio.to_thread.run_sync(_outcome, check, abandon_on_cancel=True)
                if reason:
                    failed[name] = reason
                else:
                    del failed[name]

        async with anyio.create_task_group() as tg:
            for name, check in self._checks.items():
                tg.start_soon(run, name, check)
        self._log_changes(failed)
        return Verdict(failed)

    def _kombu(self, app: Celery) -> None:
        with app.connection_for_read(connect_timeout=self.timeout_s) as connection:
            connection.ensure_connection(max_retries=0, timeout=math.ceil(self.timeout_s))

    def _log_changes(self, failed: dict[str, str]) -> None:
        for name in sorted(set(failed) | set(self._last)):
            if failed.get(name) != self._last.get(name):
                if name in failed:
                    logger.warning("not ready: %s: %s", name, failed[name])
                else:
                    logger.warning("ready again: %s answers", name)
        self._last = dict(failed)


def _outcome(check: Callable[[], None]) -> str:
    """'' when `check` passes, else the reason in a few words (the log gets the details)."""
    try:
        check()
    except RedisUnreachable as exc:
        logger.info("readiness: %s", exc)
        return "no answer"
    except ConfigurationError as exc:  # answers, but refuses us: credentials, TLS, ACL, version
        logger.info("readiness: %s", exc)
        return "refused the connection (see the server log)"
    except (redis.RedisError, OSError, KombuOperationalError) as exc:  # kombu wraps its transports' errors
        logger.info("readiness: %s", redact(str(exc)) or type(exc).__name__)
        return "no answer"
    return ""
