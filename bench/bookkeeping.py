"""What ours' bookkeeping costs per job, piece by piece: `python -m bench.bookkeeping [--jobs N] [--rounds R]`.

`python -m bench.bounds` measures each goal of issue 26 for ours and for the celery floor (the least
a server in front of Celery pays), and what ours spends above that floor per task, process by
process. This tool splits the worker's and the server's part of that extra into the pieces of
ours' bookkeeping that carry its guarantees. Each piece runs N times in this process over a private
Redis, with the stores and clients the worker and the server use; it reads this process's CPU (the
caller's side: redis-py, hiredis, our code) and Redis's (`INFO cpu`), in R interleaved rounds,
medians reported, beside references measured in the same rounds:

worker side (the worker's own store, sync redis-py):
- job start: JOB_START with the `live` ZADD, one round trip (the heartbeat's first beat, the
  at-most-once guard, the record the job runs with);
- job end: JOB_END with the `live` ZREM, one round trip (the outcome that wins once, the record's
  TTL, the PUBLISH listeners wait for, the ended stream's entry);
- references: Celery's own result write for the same job (`backend.store_result`, which every
  Celery job pays, raw ones too), and one GET round trip.

server side (asyncio redis-py, as the server's):
- record write: the record, its expiry and its `live` entry, in the pipeline that carries the
  job's message (the message itself is left out: the celery floor writes it too);
- read and view: a finished task's record read in full (HGETALL), its view and `DetailedTask`,
  what `tasks/get` and a listen stream's wake-up do for each task;
- references: the celery floor's read of a finished job (GET of Celery's result, JSON decoded),
  and one GET round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from bench.redis_tools import BenchRedis
from mcp_celery.core.status import ended_entry, task_view
from mcp_celery.protocol import TASKS_EXTENSION, now_ms
from mcp_celery.store.schema import TaskRecord

Piece = Callable[[list[str]], Awaitable[None]]


def redis_cpu_s(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")  # type: ignore[assignment]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def timed(piece: Piece, ids: list[str], probe: redis.Redis) -> tuple[float, float]:
    """CPU µs per id of this process and of Redis while `piece` runs over `ids`."""
    cpu0, redis0 = time.process_time(), redis_cpu_s(probe)
    await piece(ids)
    cpu1, redis1 = time.process_time(), redis_cpu_s(probe)
    return (cpu1 - cpu0) * 1e6 / len(ids), (redis1 - redis0) * 1e6 / len(ids)


def new_record(tool: str) -> TaskRecord:
    """A record as the server writes one for a `tools/call` from a client of the tasks extension."""
    return TaskRecord(
        task_id=str(uuid.uuid4()),
        tool=tool,
        created_ms=now_ms(),
        ttl_ms=86_400_000,
        poll_ms=1000,
        capabilities={"extensions": {TASKS_EXTENSION: {}}},
        owner="bench-principal",
    )


class Pieces:
    """Each piece, over the same jobs: the worker's and the server's stores, and plain clients."""

    def __init__(self) -> None:
        from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL
        from mcp_celery.core.binding import AppBinding
        from mcp_celery.settings import Settings
        from mcp_celery.store.aio import AsyncStore
        from mcp_celery.store.connect import async_client
        from mcp_celery.worker import outcome
        from mcp_celery.worker.config import worker_binding

        self.tool = "noop"  # bench_jobs.noop's MCP name
        self.worker_store = worker_binding(bench_jobs.app).store
        binding = AppBinding.create(bench_jobs.app, Settings())
        self.server_store = AsyncStore(async_client(binding.redis), binding.keys, binding.lifetimes, binding.durability)
        self.backend = bench_jobs.app.backend
        self.plain = redis.Redis.from_url(bench_jobs.REDIS)
        self.aplain = redis.asyncio.Redis.from_url(bench_jobs.REDIS)
        self.done = outcome.succeeded(7)
        self.records: dict[str, TaskRecord] = {}

    def in_order(self) -> dict[str, Piece]:
        """In the order a task meets them, so that each reads what the one before wrote."""
        return {
            "server: record write": self.record_write,
            "worker: job start": self.job_start,
            "worker: job end": self.job_end,
            "worker, reference: Celery's result write": self.celery_result,
            "worker, reference: one GET": self.sync_get,
            "server: read and view": self.read_view,
            "server, reference: the celery floor's read": self.celery_read,
            "server, reference: one GET": self.async_get,
        }

    async def record_write(self, ids: list[str]) -> None:
        for task_id in ids:
            await self.server_store.create(self.records[task_id], check_at_ms=now_ms() + 60_000)

    async def job_start(self, ids: list[str]) -> None:
        for task_id in ids:
            started = self.worker_store.job_started(task_id, 30_000)
            assert started is not None and started.tool == self.tool, started  # the record the server wrote

    async def job_end(self, ids: list[str]) -> None:
        for task_id in ids:
            record = self.records[task_id]
            entry = ended_entry(task_id, record.tool, self.done, created_ms=record.created_ms, started_ms=now_ms())
            self.worker_store.job_ended(task_id, asked=False, outcome=self.done, ended=entry)

    async def celery_result(self, ids: list[str]) -> None:
        for task_id in ids:
            self.backend.store_result(task_id, 7, "SUCCESS", request=None)

    async def sync_get(self, ids: list[str]) -> None:
        for _ in ids:
            self.plain.get("bench-absent")

    async def read_view(self, ids: list[str]) -> None:
        for task_id in ids:
            record = await self.server_store.read(task_id)
            assert record is not None
            view = task_view(record, now_ms(), structured=False, grace_ms=5000)
            assert view.status == "completed", view
            json.dumps(view.detailed_task(record, now_ms()))

    async def celery_read(self, ids: list[str]) -> None:
        for task_id in ids:
            raw = await self.aplain.get(f"celery-task-meta-{task_id}")
            assert raw is not None and json.loads(raw)["status"] == "SUCCESS"

    async def async_get(self, ids: list[str]) -> None:
        for _ in ids:
            await self.aplain.get("bench-absent")

    async def aclose(self) -> None:
        await self.server_store.redis.aclose()
        await self.aplain.aclose()
        self.plain.close()


async def measure(jobs: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each piece's (caller, Redis) CPU µs per job, one sample a round."""
    pieces = Pieces()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in pieces.in_order()}
    try:
        for _ in range(rounds):
            pieces.records = {r.task_id: r for r in (new_record(pieces.tool) for _ in range(jobs))}
            ids = list(pieces.records)
            for name, piece in pieces.in_order().items():
                results[name].append(await timed(piece, ids, pieces.plain))
    finally:
        await pieces.aclose()
    return results


def table(results: dict[str, list[tuple[float, float]]]) -> str:
    lines = [
        "| piece | caller CPU µs/job | Redis CPU µs/job | both |",
        "|---|---|---|---|",
    ]
    for name, samples in results.items():
        caller = statistics.median(s[0] for s in samples)
        server = statistics.median(s[1] for s in samples)
        lines.append(f"| {name} | {caller:.0f} | {server:.0f} | {caller + server:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs per piece and round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rds = BenchRedis("redis-bookkeeping")
    rds.start()
    try:
        os.environ["BENCH_REDIS_URL"] = rds.url
        results = asyncio.run(measure(a.jobs, a.rounds))
    finally:
        rds.stop()
    print(f"{a.rounds} rounds of {a.jobs} jobs, medians:\n")
    print(table(results))


if __name__ == "__main__":
    main()
