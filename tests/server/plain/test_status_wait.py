"""`task_status(wait_seconds=N)` never sleeps through the change it waits for.

In-process: the session's store and broker, a real task service (its one event listener on real
Redis pub/sub), no worker. The test makes the final status land in the one gap a waiting
`task_status` has, after its first read and before its subscription, every time: the service's
`watch` is wrapped so that the task is cancelled (a state published on the task's channel) just
before the subscription is sent. A wait that compared against the first read and only read again
after a wake-up would sleep to its deadline and answer with the stale status.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import anyio
from mcp import types

from mcp_celery.core.binding import AppBinding
from mcp_celery.core.status import CANCELLED_BEFORE_START, TaskView
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.events import Watcher
from mcp_celery.server.engine.service import TaskService
from mcp_celery.server.plain import lifecycle
from mcp_celery.server.tasks import envelope
from mcp_celery.settings import Settings
from tests.support import sample_jobs

WAIT_S = 8.0


async def _wait_across_the_gap() -> tuple[types.CallToolResult, float]:
    service = TaskService(AppBinding.create(sample_jobs.app, Settings(redis_url=sample_jobs.STORE)))
    # A stdio request (the local user's) from a client that sent no clientInfo.
    ctx: Any = SimpleNamespace(request=None, meta=None, session=SimpleNamespace(client_params=None))
    async with service.running():
        spec = service.tools["checkpoint_loop"]
        record = service.new_record(spec, owner=envelope.principal(ctx), capabilities={}, plain=True)
        await service.store.create(record)  # no message: nothing but this test changes the task
        own_watch = service.events.watch

        @asynccontextmanager
        async def cancelled_first(task_ids: Iterable[str], outputs: Iterable[str] = ()) -> AsyncIterator[Watcher]:
            # The final status, stored and published as a server's cancel of an unstarted job does it.
            cancelled = TaskView("cancelled", now_ms(), CANCELLED_BEFORE_START).to_json()
            await service.store.request_cancel(record.task_id, now_ms(), cancelled, cancelled)
            async with own_watch(task_ids, outputs) as watcher:
                yield watcher

        service.events.watch = cancelled_first  # type: ignore[method-assign]
        params = types.CallToolRequestParams(
            name="task_status", arguments={"task_id": record.task_id, "wait_seconds": WAIT_S}
        )
        started = anyio.current_time()
        with anyio.fail_after(WAIT_S + 10):
            result = await lifecycle.call(service, ctx, params)
        return result, anyio.current_time() - started


def test_a_final_status_published_between_the_first_read_and_the_subscription_ends_the_wait_at_once() -> None:
    result, took = anyio.run(_wait_across_the_gap)
    # The service's closed clients are finalized now: left to a later collection, their finalizers can
    # run inside an ast.parse (pytest's import of a plugin) and trip CPython 3.11's recursion check.
    gc.collect()
    structured = result.structured_content or {}
    assert structured.get("status") == "cancelled", result
    assert took < WAIT_S / 2, f"task_status slept {took:.1f} s through a change made before its subscription"
