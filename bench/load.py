"""Closed-loop load runner: `concurrency` workers, each with its own keep-alive client, run one operation back to back.

A window records per-operation latency, throughput, errors and the CPU share used meanwhile by processes
that are not the bench's (see `procs.CpuProbe`). The requests themselves come from `bench.rpc`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.procs import CpuProbe
from bench.rpc import new_client


def percentile_ms(seconds: list[float], p: float) -> float:
    """Nearest-rank `p`th percentile of latencies in seconds, in milliseconds."""
    s = sorted(seconds)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))] * 1000


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
        return percentile_ms(self.latencies, p) if self.latencies else float("nan")

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


async def _warm_up(
    op: Op, clients: list[httpx.AsyncClient], seq: itertools.count[int], seconds: float, res: LoadResult
) -> None:
    """Run `op` unrecorded for `seconds` (this also opens every keep-alive connection)."""
    end = time.monotonic() + seconds

    async def warm(c: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            try:
                await op(c, next(seq))
            except Exception as e:  # noqa: BLE001
                res.first_error = res.first_error or f"warm-up: {e!r}"
                await asyncio.sleep(0.01)

    await asyncio.gather(*(warm(c) for c in clients))


async def _record(
    op: Op,
    clients: list[httpx.AsyncClient],
    seq: itertools.count[int],
    res: LoadResult,
    end: float,
    hard_end: float,
    count: int | None,
    max_errors: int,
) -> None:
    """Run `op` on every client until `end` (or `count` ops in total), appending each latency to `res`."""
    remaining = [count] if count is not None else None

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
        if warmup > 0:
            await _warm_up(op, clients, seq, warmup, res)
        cpu0 = CpuProbe.sample()
        start = time.monotonic()
        end = start + duration if duration is not None else hard_end
        await _record(op, clients, seq, res, end, hard_end, count, max_errors)
        res.elapsed = time.monotonic() - start
        res.foreign_cpu = CpuProbe.foreign(cpu0, CpuProbe.sample())
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
    return res
