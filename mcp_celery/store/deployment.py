"""The whole deployment at one moment, read from Redis in a bounded number of commands.

Tier 1 (redis-py, no Celery). What it reads, and what keeps it:

* Workers: every worker process that runs MCP jobs beats (`mcp_celery.worker.heartbeat`), and
  with each beat writes what it runs (`WorkerPresence`: each job's task id, tool, start and, while
  it waits for input, since when) to `Keys.worker(id)`, expiring with the beat, and scores itself
  in `Keys.workers()` by the beat's deadline. So the tasks that run or wait for input now, by tool,
  and the oldest ones waiting, come from the live workers' own word: one ZRANGEBYSCORE and one GET
  per live worker process (at most `MAX_WORKERS`), whatever the number of tasks. A process shows
  once it has run its first MCP job.
* Queues: the length of each of the broker's queue lists (kombu's Redis layout, one list per
  priority step) and of its unacked hash: one LLEN/HLEN each, on the broker's Redis.
* Unfinished tasks: ZCARD of `Keys.live()` (the reaper's watch list: every task not ended, with any
  broker, since servers look at an unstarted task for a worker's refusal).
* Recent endings: the latest `RECENT` entries of the ended stream (`mcp_celery.store.ended`), with
  their reasons; absent on a cluster store, which keeps no stream.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_celery.store.commands import is_cluster
from mcp_celery.store.connect import AsyncRedis
from mcp_celery.store.ended import EndedEntry
from mcp_celery.store.schema import FIELD, Keys, as_text

__all__ = [
    "MAX_JOBS_SHOWN",
    "MAX_WORKERS",
    "RECENT",
    "BrokerQueues",
    "DeploymentReader",
    "DeploymentSnapshot",
    "WorkerJob",
    "WorkerPresence",
]

#: The most worker processes one snapshot reads (one GET each).
MAX_WORKERS = 500
#: The most jobs one worker process lists in its beat (a thread pool may run many).
MAX_JOBS_SHOWN = 50
#: How many of the latest stream entries a snapshot reads.
RECENT = 500
#: How many of the oldest parked tasks a snapshot names.
OLDEST_PARKED = 10


@dataclass(frozen=True)
class WorkerJob:
    """A job a worker process runs: its task, tool, start (ms) and, while it waits for input, since when."""

    task_id: str
    tool: str
    started_ms: int
    input_since_ms: int | None = None

    @property
    def status(self) -> str:
        return "working" if self.input_since_ms is None else "input_required"


@dataclass(frozen=True)
class WorkerPresence:
    """What one worker process said in its last beat."""

    worker_id: str  # host:pid
    node: str  # the Celery worker's name (celery@host), '' before its first job says it
    beat_ms: int
    jobs: tuple[WorkerJob, ...] = ()
    alive_until_ms: int = 0

    def to_json(self) -> str:
        jobs = [[j.task_id, j.tool, j.started_ms, j.input_since_ms] for j in self.jobs[:MAX_JOBS_SHOWN]]
        return json.dumps({"id": self.worker_id, "node": self.node, "beat": self.beat_ms, "jobs": jobs})

    @classmethod
    def from_json(cls, text: str, alive_until_ms: int = 0) -> WorkerPresence:
        raw = json.loads(text)
        jobs = tuple(
            WorkerJob(str(j[0]), str(j[1]), int(j[2]), None if j[3] is None else int(j[3])) for j in raw["jobs"]
        )
        return cls(str(raw["id"]), str(raw.get("node", "")), int(raw["beat"]), jobs, alive_until_ms)


@dataclass(frozen=True)
class BrokerQueues:
    """The broker's Redis and the lists of each queue (kombu's layout), plus its unacked hash."""

    client: AsyncRedis
    lists: Mapping[str, Sequence[str]]  # queue -> its lists, one per priority step
    unacked: str


@dataclass(frozen=True)
class DeploymentSnapshot:
    """The deployment at `at_ms`."""

    at_ms: int
    workers: tuple[WorkerPresence, ...]
    unfinished: int
    queue_depths: Mapping[str, int] = field(default_factory=lambda: {})
    unacked: int | None = None  # None: not a Redis broker
    recent: tuple[EndedEntry, ...] | None = None  # newest first; None: no stream (a cluster store)
    #: Tasks whose job is parked at a question (no worker holds them), and the oldest of them.
    parked: int = 0
    oldest_parked: tuple[WorkerJob, ...] = ()

    @property
    def jobs(self) -> list[WorkerJob]:
        return [job for worker in self.workers for job in worker.jobs]

    def tasks_now(self) -> Counter[tuple[str, str]]:
        """Running tasks by (status, tool): working or input_required, as the live workers say."""
        return Counter((job.status, job.tool) for job in self.jobs)

    def oldest_waiting(self, limit: int = 10) -> list[WorkerJob]:
        """The tasks waiting for input the longest, oldest first: in a worker process, or parked."""
        waiting = [job for job in self.jobs if job.input_since_ms is not None] + list(self.oldest_parked)
        return sorted(waiting, key=lambda job: job.input_since_ms or 0)[:limit]

    def is_parked(self, job: WorkerJob) -> bool:
        return job in self.oldest_parked

    def oldest_input_wait_s(self) -> float:
        oldest = self.oldest_waiting(1)
        return max(self.at_ms - (oldest[0].input_since_ms or self.at_ms), 0) / 1000 if oldest else 0.0

    def recent_failures(self, limit: int = 10) -> list[EndedEntry]:
        return [entry for entry in self.recent or () if entry.failed][:limit]

    def recent_ended(self) -> Counter[tuple[str, str]]:
        """The recent endings by (tool, status); a tool error counts as `error`."""
        return Counter((e.tool, "error" if e.tool_error else e.status) for e in self.recent or ())


class DeploymentReader:
    """Reads `DeploymentSnapshot`s: two round trips to the store, one to the broker."""

    def __init__(self, client: AsyncRedis, keys: Keys, broker: BrokerQueues | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.broker = broker
        #: A cluster store keeps no ended stream (`mcp_celery.store.ended`).
        self.streams = not is_cluster(client)

    async def snapshot(self, now_ms: int, recent: int = 0) -> DeploymentSnapshot:
        """The deployment now, with the `recent` latest endings (at most `RECENT`; none on a cluster store)."""
        read_recent = self.streams and recent > 0
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(self.keys.workers(), now_ms, "+inf", start=0, num=MAX_WORKERS, withscores=True)
            pipe.zcard(self.keys.live())
            pipe.zcard(self.keys.parked())
            pipe.zrange(self.keys.parked(), 0, OLDEST_PARKED - 1, withscores=True)
            if read_recent:
                pipe.xrevrange(self.keys.ended(), count=min(recent, RECENT))
            replies = await pipe.execute()
        live = [(as_text(member), int(score)) for member, score in replies[0]]
        workers = await self._presences(live)
        ended = tuple(EndedEntry.from_fields(_decoded(f)) for _, f in replies[4]) if read_recent else None
        depths, unacked = await self._queues()
        parked = await self._parked([(as_text(member), int(score)) for member, score in replies[3]])
        return DeploymentSnapshot(now_ms, workers, int(replies[1]), depths, unacked, ended, int(replies[2]), parked)

    async def _parked(self, oldest: list[tuple[str, int]]) -> tuple[WorkerJob, ...]:
        """The oldest parked tasks as jobs waiting since they asked (their tools read from the records)."""
        if not oldest:
            return ()
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id, _ in oldest:
                pipe.hget(self.keys.task(task_id), FIELD.TOOL)
            tools = await pipe.execute()
        return tuple(
            WorkerJob(task_id, as_text(tool), since, since)
            for (task_id, since), tool in zip(oldest, tools, strict=True)
            if tool is not None  # gone: expired, or deleted with its task
        )

    async def _presences(self, live: list[tuple[str, int]]) -> tuple[WorkerPresence, ...]:
        if not live:
            return ()
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker_id, _ in live:
                pipe.get(self.keys.worker(worker_id))
            texts = await pipe.execute()
        return tuple(
            WorkerPresence.from_json(as_text(text), until) for (_, until), text in zip(live, texts, strict=True) if text
        )

    async def aclose(self) -> None:
        """Close the store's client and the broker's (a reader of its own, as `mcp-celery top`'s)."""
        await self.redis.aclose()
        if self.broker is not None:
            await self.broker.client.aclose()

    async def _queues(self) -> tuple[dict[str, int], int | None]:
        broker = self.broker
        if broker is None:
            return {}, None
        names = sorted(broker.lists)
        async with broker.client.pipeline(transaction=False) as pipe:
            for name in names:
                for key in broker.lists[name]:
                    pipe.llen(key)
            pipe.hlen(broker.unacked)
            lengths = await pipe.execute()
        depths, at = {}, 0
        for name in names:
            steps = len(broker.lists[name])
            depths[name] = sum(int(n) for n in lengths[at : at + steps])
            at += steps
        return depths, int(lengths[-1])


def _decoded(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in fields.items()}
