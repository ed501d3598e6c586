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
from collections.abc import AsyncIterator, Sequence
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
from mcp_celery.server.reaper import Reaper
from mcp_celery.status import TaskView, expired, task_view
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
        self._reaper: Reaper | None = None
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
            self._store = AsyncStore(client, self.binding.keys, self.binding.lifetimes)
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
        events = self._events = TaskEvents(self.store.redis, self.binding.keys.events)
        reaper = self._reaper = Reaper(self)
        await self.publisher.native()  # connects to the broker now rather than on the first tools/call
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(events.run)
            tg.start_soon(self._report_on_signal)
            tg.start_soon(self._reap_lost_jobs, reaper)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self._tg = self._events = self._reaper = None
        await events.aclose()
        await reaper.aclose()
        if self._publisher is not None:
            await self._publisher.aclose()
            self._publisher = None
        if self._store is not None:
            await self._store.aclose()
            self._store = None

    async def _reap_lost_jobs(self, reaper: Reaper) -> None:
        """Turn the tasks whose heartbeat ran out `failed` (or re-queue them), and so tell their listeners.

        Every server process does this, none of them special: the read freezes the terminal state
        with a check-and-set, so two replicas reaping the same task agree, and the freeze publishes
        the change. A task read by a client first is frozen by that read just the same. Also ends
        the tasks whose message was lost before a job started (`mcp_celery.server.reaper`).
        """
        while True:
            await anyio.sleep(reaper.period_s)
            try:
                await reaper.sweep()
            except (RedisError, OSError):
                logger.warning("could not look for lost jobs; trying again in %.1f s", reaper.period_s, exc_info=True)
            except Exception:  # noqa: BLE001 - a surprise in one sweep must not stop the server
                logger.exception("looking for lost jobs failed; trying again in %.1f s", reaper.period_s)

    def first_check_ms(self, created_ms: int) -> int | None:
        """When a new task's message is first looked for if no job has started (None: never)."""
        return None if self._reaper is None else self._reaper.first_check_ms(created_ms)

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
        return await self._view_of(task_id, await self.store.read(task_id))

    async def read_views(self, task_ids: Sequence[str]) -> dict[str, tuple[TaskRecord, TaskView]]:
        """`read_view` of several tasks in one round trip; unknown and expired ones are left out."""
        views = {}
        for task_id, record in zip(task_ids, await self.store.read_many(task_ids), strict=True):
            found = await self._view_of(task_id, record)
            if found is not None:
                views[task_id] = found
        return views

    async def _view_of(self, task_id: str, record: TaskRecord | None) -> tuple[TaskRecord, TaskView] | None:
        if record is None:
            return None
        now = now_ms()
        spec = self.tools.get(record.tool)
        view = task_view(
            record,
            now,
            structured=spec is not None and spec.structured,
            grace_ms=int(self.settings.cancel_grace_s * 1000),
            debug=self.settings.debug,
            redelivered_on_loss=spec is not None and spec.redelivered_on_loss,
        )
        if view.terminal and record.final is None and record.outcome is None:
            # A terminal state the job did not store (cancelled past the grace period, worker lost)
            # is frozen here, so that a late outcome or a redelivery cannot change it; a stored
            # outcome never changes (the first one wins).
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
        record = await self.store.read(task_id)
        if record is not None and record.outcome is None:
            logger.warning("task %s did not stop within the grace period; terminating its worker process", task_id)
            app = self.binding.app
            await anyio.to_thread.run_sync(lambda: app.control.revoke(task_id, terminate=True))
