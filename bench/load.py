"""Raw JSON-RPC load client: asyncio + one httpx.AsyncClient per concurrent worker.

Every request is a 2026-07-28 stateless POST: `_meta` envelope in params and the
MCP-Protocol-Version / Mcp-Method / Mcp-Name headers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.procs import CpuProbe

PROTOCOL = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"
META_DECLARED = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXT: {}}},
}
META_PLAIN = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {},
}
_ids = itertools.count(1)


class RpcError(Exception):
    pass


def request(method: str, params: dict[str, Any], name: str, declare: bool = True) -> tuple[dict[str, str], bytes]:
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": META_DECLARED if declare else META_PLAIN},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    return headers, json.dumps(body, separators=(",", ":")).encode()


def _parse(resp: httpx.Response) -> dict[str, Any]:
    ctype = resp.headers.get("content-type", "")
    text = resp.text
    if ctype.startswith("text/event-stream"):  # tolerate SSE framing: take the last data: line
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        if not data:
            raise RpcError(f"HTTP {resp.status_code}: empty SSE body")
        text = data[-1]
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise RpcError(f"HTTP {resp.status_code}: non-JSON body {text[:200]!r}") from e
    if "error" in msg:
        raise RpcError(f"HTTP {resp.status_code}: {msg['error']}")
    if resp.status_code != 200 or "result" not in msg:
        raise RpcError(f"HTTP {resp.status_code}: {text[:200]}")
    return msg["result"]


async def rpc(
    client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], name: str, declare: bool = True
) -> dict[str, Any]:
    headers, body = request(method, params, name, declare)
    resp = await client.post(url, content=body, headers=headers)
    return _parse(resp)


async def call_tool(
    client: httpx.AsyncClient, url: str, tool: str, args: dict[str, Any], declare: bool = True
) -> dict[str, Any]:
    return await rpc(client, url, "tools/call", {"name": tool, "arguments": args}, tool, declare)


async def tasks_get(client: httpx.AsyncClient, url: str, task_id: str) -> dict[str, Any]:
    return await rpc(client, url, "tasks/get", {"taskId": task_id}, task_id)


def new_client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits)


@dataclass
class LoadResult:
    concurrency: int
    latencies: list[float] = field(default_factory=list)  # seconds
    elapsed: float = 0.0
    errors: int = 0
    first_error: str = ""
    foreign_cpu: float = float("nan")  # share of CPU used by processes that are not the bench's

    @property
    def n(self) -> int:
        return len(self.latencies)

    def pct(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
        return xs[k] * 1000.0

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def p95(self) -> float:
        return self.pct(95)

    @property
    def rate(self) -> float:
        return self.n / self.elapsed if self.elapsed > 0 else float("nan")

    def summary(self) -> str:
        err = f" ({self.first_error[:120]})" if self.errors else ""
        return (
            f"c={self.concurrency} n={self.n} p50={self.p50:.2f}ms p95={self.p95:.2f}ms "
            f"rate={self.rate:.0f}/s errors={self.errors} foreign-cpu={self.foreign_cpu:.0%}{err}"
        )


Op = Callable[[httpx.AsyncClient, int], Awaitable[Any]]


async def run_load(
    op: Op,
    concurrency: int,
    *,
    duration: float | None = None,
    count: int | None = None,
    warmup: float = 0.5,
    deadline: float = 120.0,
    max_errors: int = 50,
) -> LoadResult:
    """Closed loop: `concurrency` workers, each with its own client, run `op(client, seq)` back to back.

    Warm-up for `warmup` seconds (not recorded), then record for `duration` seconds or `count` ops in total.
    Bounded by `deadline` seconds overall.
    """
    assert duration is not None or count is not None
    res = LoadResult(concurrency)
    clients = [new_client() for _ in range(concurrency)]
    seq = itertools.count()
    hard_end = time.monotonic() + deadline
    try:
        # warm-up (also opens every keep-alive connection)
        if warmup > 0:
            w_end = time.monotonic() + warmup

            async def warm(c: httpx.AsyncClient) -> None:
                while time.monotonic() < w_end:
                    try:
                        await op(c, next(seq))
                    except Exception as e:  # noqa: BLE001
                        res.first_error = res.first_error or f"warm-up: {e!r}"
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(warm(c) for c in clients))
        remaining = [count] if count is not None else None
        cpu0 = CpuProbe.sample()
        start = time.monotonic()
        end = start + duration if duration is not None else hard_end

        async def worker(c: httpx.AsyncClient) -> None:
            lat = res.latencies
            while True:
                now = time.monotonic()
                if now >= end or now >= hard_end or res.errors > max_errors:
                    return
                if remaining is not None:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                t0 = time.perf_counter()
                try:
                    await op(c, next(seq))
                except Exception as e:  # noqa: BLE001
                    res.errors += 1
                    if not res.first_error or res.first_error.startswith("warm-up"):
                        res.first_error = repr(e)
                    continue
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker(c) for c in clients))
        res.elapsed = time.monotonic() - start
        res.foreign_cpu = CpuProbe.foreign(cpu0, CpuProbe.sample())
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
    return res


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000 if xs else float("nan")
