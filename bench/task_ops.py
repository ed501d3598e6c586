"""Operations the load windows run against a SEP-2663 task server (ours or FastMCP), and bulk helpers."""

from __future__ import annotations

import asyncio
import time

import httpx

from bench import rpc
from bench.config import POLL_INTERVAL_S
from bench.load import Op, run_load
from mcp_celery import idempotency


def task_id_of(handle: dict[str, object]) -> str:
    """The task id of a tools/call answer that must be a task handle."""
    if handle.get("resultType") != "task":
        raise rpc.RpcError(f"not a task: {handle}")
    return str(handle["taskId"])


def create_op(url: str, tool: str = "noop") -> Op:
    """tools/call `tool` that must come back as a task handle (the job then runs on the worker)."""

    async def op(c: httpx.AsyncClient, i: int) -> None:
        task_id_of(await rpc.call_tool(c, url, tool, {"x": i}))

    return op


def keyed_create_op(url: str, tool: str = "noop") -> Op:
    """`create_op` with a fresh idempotency key per call, in the `Idempotency-Key` header (issue 47)."""

    async def op(c: httpx.AsyncClient, i: int) -> None:
        headers, body = rpc.request("tools/call", {"name": tool, "arguments": {"x": i}}, tool)
        headers[idempotency.HEADER] = idempotency.new_key()
        task_id_of(rpc.parse(await c.post(url, content=body, headers=headers)))

    return op


def sync_op(url: str, tool: str = "noop") -> Op:
    """tools/call `tool` without the tasks extension declared: a plain CallToolResult."""

    async def op(c: httpx.AsyncClient, i: int) -> None:
        res = await rpc.call_tool(c, url, tool, {"x": i}, declare=False)
        if res.get("resultType") == "task" or "content" not in res:
            raise rpc.RpcError(f"not a CallToolResult: {res}")

    return op


def get_op(url: str, ids: list[str]) -> Op:
    """tasks/get on the given ids in turn."""

    async def op(c: httpx.AsyncClient, i: int) -> None:
        await rpc.tasks_get(c, url, ids[i % len(ids)])

    return op


def e2e_op(url: str, tool: str = "noop") -> Op:
    """Create a task, then poll tasks/get every POLL_INTERVAL_S until it is completed."""

    async def op(c: httpx.AsyncClient, i: int) -> None:
        tid = task_id_of(await rpc.call_tool(c, url, tool, {"x": i}))
        end = time.monotonic() + 60
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            g = await rpc.tasks_get(c, url, tid)
            st = g.get("status")
            if st == "completed":
                return
            if st in ("failed", "cancelled"):
                raise rpc.RpcError(f"task {tid} {st}: {g}")
            if time.monotonic() > end:
                raise TimeoutError(f"task {tid} still {st}")

    return op


async def create_many(url: str, n: int, conc: int, deadline_s: float = 300) -> list[str]:
    """Create `n` noop tasks from `conc` clients; returns their ids."""
    ids: list[str] = []

    async def op(c: httpx.AsyncClient, i: int) -> None:
        ids.append(task_id_of(await rpc.call_tool(c, url, "noop", {"x": i})))

    res = await run_load(op, conc, count=n, warmup=0, deadline=deadline_s, max_errors=5)
    if res.errors:
        raise RuntimeError(f"create_many: {res.errors} errors: {res.first_error}")
    return ids


async def all_completed(url: str, ids: list[str], conc: int = 8) -> int:
    """tasks/get every id; returns how many are completed."""
    done = 0
    it = iter(ids)

    async def w() -> None:
        nonlocal done
        async with rpc.new_client() as c:
            for tid in it:
                g = await rpc.tasks_get(c, url, tid)
                done += g.get("status") == "completed"

    await asyncio.gather(*(w() for _ in range(conc)))
    return done
