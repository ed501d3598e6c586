"""The state every server handler shares: the app binding, the async store, the event listener.

Server tier. Every handler reads and writes Redis only; nothing about a task lives in this
process's memory, so any number of replicas can serve the same tasks and a restart loses
nothing. The one in-process thing is a timer per cancel that, after the grace period,
terminates a job that opted in (the read path reports the task cancelled on its own, timer
or not).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import redis.asyncio as aioredis
from anyio.abc import TaskGroup
from mcp.shared.exceptions import MCPError
from redis.exceptions import RedisError

from mcp_celery.binding import AppBinding
from mcp_celery.protocol import INTERNAL_ERROR, now_ms
from mcp_celery.server.events import TaskEvents
from mcp_celery.server.publish import Publisher
from mcp_celery.status import READY_STATES, TaskView, expired, task_view
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.schema import TaskRecord
from mcp_celery.tools import ToolSpec, registry

__all__ = ["TaskService"]

logger = logging.getLogger(__name__)


class TaskService:
    """Reads, cancels and waits on tasks for the handlers; lives as long as the server."""

    def __init__(self, binding: AppBinding) -> None:
        self.binding = binding
        self.settings = binding.settings
        self._store: AsyncStore | None = None
        self._events: TaskEvents | None = None
        self._tg: TaskGroup | None = None
        self._publisher: Publisher | None = None

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return registry(self.binding.app)

    @property
    def store(self) -> AsyncStore:
        if self._store is None:
            # Bounded, so that a burst of requests cannot open a connection each; named, so that an
            # operator's CLIENT LIST tells which server process holds which connection.
            pool = aioredis.BlockingConnectionPool.from_url(
                self.binding.redis_url,
                max_connections=self.settings.redis_max_connections,
                client_name=f"mcp-celery-server:{os.getpid()}",
            )
            client = aioredis.Redis(connection_pool=pool)
            self._store = AsyncStore(client, self.binding.keys, self.binding.lifetimes, self.binding.backend.meta_key)
        return self._store

    @property
    def publisher(self) -> Publisher:
        """Queues jobs: natively on a plain Redis broker, else with `apply_async` on a thread."""
        if self._publisher is None:
            self._publisher = Publisher(self.binding.app, self.store.redis)
        return self._publisher

    @property
    def events(self) -> TaskEvents:
        """The process's one event listener.

        Raises:
            MCPError: outside the server's lifespan (a server that was never run).
        """
        if self._events is None:
            raise MCPError(INTERNAL_ERROR, "the server is not running (no lifespan)")
        return self._events

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The server's lifespan: the event listener and the cancel timers run inside it."""
        events = self._events = TaskEvents(self.store.redis, self.binding.backend.meta_key)
        await self.publisher.native()  # connects to the broker now rather than on the first tools/call
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(events.run)
            tg.start_soon(self._report_on_signal)
            tg.start_soon(self._reap_lost_jobs)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self._tg = self._events = None
        await events.aclose()
        if self._publisher is not None:
            await self._publisher.aclose()
            self._publisher = None
        if self._store is not None:
            await self._store.aclose()
            self._store = None

    async def _reap_lost_jobs(self) -> None:
        """Turn the tasks whose heartbeat ran out `failed`, and so tell their listeners.

        Every server process does this, none of them special: the read freezes the terminal state
        with a check-and-set, so two replicas reaping the same task agree, and the freeze publishes
        the change. A task read by a client first is frozen by that read just the same.
        """
        period = max(self.settings.worker_lost_timeout_s / 3, 0.2)
        while True:
            await anyio.sleep(period)
            try:
                overdue = await self.store.overdue(now_ms())
                done = [task_id for task_id in overdue if await self._settled(task_id)]
                await self.store.forget_live(done)
            except (RedisError, OSError):
                logger.warning("could not look for lost jobs; trying again in %.1f s", period, exc_info=True)

    async def _settled(self, task_id: str) -> bool:
        """Read the task (freezing it if its worker is lost); True once nothing more is to be watched."""
        found = await self.read_view(task_id)
        return found is None or found[1].terminal

    async def _report_on_signal(self) -> None:
        """`kill -USR1 PID` logs what the process holds: how operators (and the tests) see leaks."""
        with anyio.open_signal_receiver(signal.SIGUSR1) as signals:
            async for _ in signals:
                logger.warning(
                    "mcp-celery diagnostics: %s", " ".join(f"{k}={v}" for k, v in self.diagnostics().items())
                )

    def diagnostics(self) -> dict[str, int]:
        """Counts that must return to where they were once clients go away."""
        return {
            "asyncio_tasks": len(asyncio.all_tasks()),
            "watched_channels": 0 if self._events is None else self._events.channels,
            "watchers": 0 if self._events is None else self._events.watchers,
        }

    async def read_view(self, task_id: str) -> tuple[TaskRecord, TaskView] | None:
        """The task's record and MCP view, or None when it is unknown or expired."""
        record, raw_meta = await self.store.read(task_id)
        if record is None:
            return None
        meta = self.binding.backend.decode(raw_meta)
        now = now_ms()
        spec = self.tools.get(record.tool)
        view = task_view(
            record,
            meta,
            now,
            structured=spec is not None and spec.structured,
            grace_ms=int(self.settings.cancel_grace_s * 1000),
            debug=self.settings.debug,
            redelivered_on_loss=spec is not None and spec.redelivered_on_loss,
        )
        if view.terminal and record.final is None and (meta or {}).get("status") != "SUCCESS":
            # Celery itself never overwrites SUCCESS; every other terminal state is frozen
            # here so that a late result, a redelivery or a retry cannot change it.
            frozen = await self.store.freeze(task_id, view.to_json())
            if frozen is None:
                return None
            view = TaskView.from_frozen(frozen)
        if expired(record, view, now):
            return None
        return record, view

    async def cancel(self, task_id: str, spec: ToolSpec | None) -> None:
        """Flag the task cancelled (the job checks the flag) and drop any queued copy."""
        await self.store.request_cancel(task_id, now_ms())
        # Drops a queued copy; a running job learns of the cancel from the flag in Redis.
        app = self.binding.app
        await anyio.to_thread.run_sync(lambda: app.control.revoke(task_id))
        if self._tg is not None and spec is not None and spec.terminate_on_cancel:
            self._tg.start_soon(self._terminate_after_grace, task_id)

    async def _terminate_after_grace(self, task_id: str) -> None:
        await anyio.sleep(self.settings.cancel_grace_s)
        record, meta = await self.store.read(task_id)
        decoded = self.binding.backend.decode(meta)
        if record is not None and (decoded or {}).get("status") not in READY_STATES:
            logger.warning("task %s did not stop within the grace period; terminating its worker process", task_id)
            app = self.binding.app
            await anyio.to_thread.run_sync(lambda: app.control.revoke(task_id, terminate=True))
