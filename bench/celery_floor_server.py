"""The floor of any MCP server in front of Celery: the empty SDK server of `bench.floor_server` whose
tool is raw Celery's own client driving `bench_jobs.raw_noop`, without mcp-celery's task machinery.

- `tools/call` with it declared: the job's message sent, answered with a task handle.
- `tools/call` without it: the message sent after a subscription to the result channel Celery's Redis
  backend publishes on, answered with the result as a plain CallToolResult; the synchronous path, as
  `delay().get()` runs it, without blocking the event loop.
- `tasks/get`: one GET of Celery's own result key; `completed` once it reads SUCCESS.
- `subscriptions/listen` over `taskIds`: the acknowledgement, then one `notifications/tasks` per job
  as it ends, carrying what Celery's result gives (status, end time, the tool's result; no first
  state of each task, no owner check), then the listen result.

The message is Celery's own (`apply_async` builds it) and goes out with asyncio redis-py, through
mcp-celery's `Publisher`: the cheapest way we know to queue a Celery job from an async server, so the
floor has it too. Nothing else of mcp-celery is here: no record, no owner, no TTL, no cancel, no view.
What is left between this and mcp-celery over the same worker is our own work; what this costs over
raw Celery is the price of an MCP server in front of it.
Run: python -m bench.celery_floor_server PORT (BENCH_REDIS_URL names the Redis).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import mcp.types as types
import redis.asyncio as aioredis
import uvicorn
from celery import _state as celery_state
from celery import states
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from bench import bench_jobs
from bench.floor_server import TaskIdParams, list_tools
from bench.rpc import TASKS_EXT
from mcp_celery.server.engine.publish import Publisher, add_commands
from mcp_celery.store.connect import redis_target


def declared(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the request's `_meta` declares the tasks extension (the wire's per-request capabilities)."""
    meta: dict[str, Any] = dict(ctx.meta or {})
    caps = meta.get("io.modelcontextprotocol/clientCapabilities") or {}
    return TASKS_EXT in (caps.get("extensions") or {})


def result_key(task_id: str) -> bytes:
    """The key Celery's Redis backend stores a task's result under, and the channel it publishes it on."""
    key: bytes = bench_jobs.app.backend.get_key_for_task(task_id)  # type: ignore[attr-defined]
    return key


class Queue:
    """Sends `raw_noop` jobs: Celery's message, written with asyncio redis-py."""

    def __init__(self) -> None:
        self.publisher = Publisher(bench_jobs.app, redis_target(bench_jobs.BROKER))  # the broker is the "store"
        self.broker = aioredis.Redis.from_url(bench_jobs.BROKER)

    async def send(self, x: Any, task_id: str) -> None:
        if not await self.publisher.native():
            raise RuntimeError("the broker is not a plain Redis")
        commands = self.publisher.build(bench_jobs.raw_noop, args=(x,), task_id=task_id)
        async with self.broker.pipeline(transaction=False) as pipe:
            add_commands(pipe, commands)
            await pipe.execute()


class Results:
    """Celery's results as its Redis backend publishes them, read on one pub/sub connection.

    A call subscribes to its tasks' result channels (without awaiting the confirmation, as Celery's
    own client does: Redis handles the SUBSCRIBE long before a job sent after it can end), and the
    reader hands each ready result to the call waiting on that channel. A listen over jobs sent
    earlier awaits the confirmation before it reads their results: the read goes on another
    connection, and Redis may serve it before the SUBSCRIBE, so a job ending between the two would
    go unheard (this happened with hiredis's faster parser).
    """

    KEEP = "bench-celery-floor:keep"  # one channel always subscribed, so the reader never finds none

    def __init__(self, client: aioredis.Redis, queue: Queue) -> None:
        self.client = client
        self.pubsub = client.pubsub()
        self.queue = queue
        self.waiting: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self.confirming: dict[bytes, asyncio.Future[None]] = {}  # channels whose SUBSCRIBE someone awaits
        self.reader: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def watching(
        self, task_ids: list[str], *, confirmed: bool = False
    ) -> AsyncIterator[list[asyncio.Future[dict[str, Any]]]]:
        """A future per task for its ready result, subscribed for the block (`confirmed`: by Redis, on entry)."""
        channels = [result_key(task_id) for task_id in task_ids]
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in channels]
        self.waiting.update(zip(channels, futures, strict=True))
        confirmations = [self.confirming.setdefault(channel, loop.create_future()) for channel in channels if confirmed]
        try:
            await self.pubsub.subscribe(*channels)
            if self.reader is None:
                await self.pubsub.subscribe(self.KEEP)
                self.reader = asyncio.create_task(self._read())
            if confirmations:
                await asyncio.wait_for(asyncio.gather(*confirmations), 10)
            yield futures
        finally:
            for channel in channels:
                del self.waiting[channel]
                self.confirming.pop(channel, None)
            await self.pubsub.unsubscribe(*channels)

    async def run(self, x: Any) -> Any:
        """Send one job and wait for its result (the synchronous path)."""
        task_id = str(uuid.uuid4())
        async with self.watching([task_id]) as (done,):
            await self.queue.send(x, task_id)
            meta = await asyncio.wait_for(done, 30)
        if meta["status"] != states.SUCCESS:
            raise RuntimeError(f"raw_noop {task_id}: {meta['status']}")
        return meta["result"]

    async def each_ready(self, task_ids: list[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Each task id of jobs sent earlier with its ready result, as each becomes ready."""
        async with self.watching(task_ids, confirmed=True) as futures:
            # Results stored before the subscription were published unheard: one read for those, as
            # Celery's own client does after it subscribes.
            for done, raw in zip(futures, await self.client.mget([result_key(t) for t in task_ids]), strict=True):
                if raw is not None:
                    self._settle(done, json.loads(raw))
            task_of = {id(done): task_id for done, task_id in zip(futures, task_ids, strict=True)}
            pending: set[asyncio.Future[dict[str, Any]]] = set(futures)
            while pending:
                ready, pending = await asyncio.wait(pending, timeout=60, return_when=asyncio.FIRST_COMPLETED)
                if not ready:
                    raise TimeoutError(f"{len(pending)} jobs not ready within 60 s")
                for done in ready:
                    yield task_of[id(done)], done.result()

    async def _read(self) -> None:
        while True:
            msg = await self.pubsub.get_message(timeout=None)
            if msg is None:
                continue
            if msg["type"] == "message":
                done = self.waiting.get(msg["channel"])
                if done is not None:
                    self._settle(done, json.loads(msg["data"]))
            elif msg["type"] == "subscribe":
                confirmed = self.confirming.pop(msg["channel"], None)
                if confirmed is not None and not confirmed.done():
                    confirmed.set_result(None)

    @staticmethod
    def _settle(done: asyncio.Future[dict[str, Any]], meta: dict[str, Any]) -> None:
        # The worker publishes STARTED too (task_track_started): only a ready state ends the wait.
        if meta["status"] in states.READY_STATES and not done.done():
            done.set_result(meta)


def ended_task(task_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """What the floor knows of an ended job as a `DetailedTask`: status, end time and the tool's result."""
    task: dict[str, Any] = {"taskId": task_id, "lastUpdatedAt": result.get("date_done")}
    if result["status"] != states.SUCCESS:
        return {**task, "status": "failed", "error": {"code": -32603, "message": str(result.get("result"))}}
    content = [{"type": "text", "text": str(result["result"])}]
    return {**task, "status": "completed", "result": {"content": content, "isError": False}}


class TaskNotice(types.Notification[dict[str, Any], Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def build() -> Server[Any]:
    client = aioredis.Redis.from_url(bench_jobs.BACKEND)
    queue = Queue()
    results = Results(client, queue)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        x = (params.arguments or {}).get("x", 0)
        if declared(ctx):
            task_id = str(uuid.uuid4())
            await queue.send(x, task_id)
            return {"resultType": "task", "taskId": task_id, "status": "working"}
        value = await results.run(x)
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(value))])

    async def tasks_get(ctx: ServerRequestContext[Any], params: TaskIdParams) -> dict[str, Any]:
        raw = await client.get(result_key(params.task_id))
        state = json.loads(raw)["status"] if raw else "PENDING"
        return {"taskId": params.task_id, "status": "completed" if state == "SUCCESS" else "working"}

    async def listen(
        ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        task_ids = list((params.notifications.model_extra or {}).get("taskIds") or [])
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        acknowledged = types.SubscriptionsAcknowledgedNotificationParams(notifications=params.notifications, _meta=meta)
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(params=acknowledged), related_request_id=ctx.request_id
        )
        async for task_id, result in results.each_ready(task_ids):
            notice = TaskNotice(params={**ended_task(task_id, result), "_meta": meta})
            await ctx.session.send_notification(notice, related_request_id=ctx.request_id)  # type: ignore[arg-type]
        return types.SubscriptionsListenResult(_meta=meta)

    s: Server[Any] = Server("bench-celery-floor", version="0", on_list_tools=list_tools)
    # Registered as a request handler, not `on_call_tool`: the declared path answers a task handle.
    s.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
    s.add_request_handler("tasks/get", TaskIdParams, tasks_get)
    s.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen)
    s.extensions[TASKS_EXT] = {}
    return s


if __name__ == "__main__":
    # As mcp-celery's server does: otherwise `apply_async` subscribes Celery's own result consumer to
    # every task it sends, results this server reads on its own connection or not at all.
    celery_state._set_task_join_will_block(True)  # type: ignore[attr-defined]
    port = int(sys.argv[1])
    app = build().streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
