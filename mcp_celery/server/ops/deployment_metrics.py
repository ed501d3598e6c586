"""Deployment-wide figures for Prometheus: `DeploymentCollector`, fed by `DeploymentFigures`.

Server tier. Two kinds of figures, each counted once however many server replicas are scraped:

* Gauges of the whole deployment now (tasks running and waiting for input by tool, queue depths,
  live worker processes, the oldest wait for input; `mcp_celery.store.deployment`): only the
  replica that holds a short lease in Redis (`Keys.figures_lease`, SET NX PX, renewed at each
  refresh) reads them and reports them; the others report none. `mcp_celery_deployment_reporting`
  says which replica it is (1) on every replica.
* Counters and histograms of ended tasks (ended by tool and status, lost with their worker, queue
  wait, run time, time waiting for input), from the ended stream (`mcp_celery.store.ended`): every
  replica reads it through one consumer group, so each entry is counted by one replica only, in its
  own series; sum them over replicas. A Redis Cluster store keeps no stream: these are absent there.

A background task of each server process (`DeploymentFigures.run`, started beside the reaper)
does the Redis reads; `collect()` only formats what the last ones found, so a scrape costs Redis
nothing and never waits on it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError, ResponseError

from mcp_celery.core.binding import queue_of
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.broker import RedisBroker
from mcp_celery.server.ops import metrics
from mcp_celery.server.ops.metrics import MULTIPROC_ENV, REPLICA_ENV
from mcp_celery.store.connect import AsyncRedis
from mcp_celery.store.deployment import BrokerQueues, DeploymentReader, DeploymentSnapshot
from mcp_celery.store.ended import EndedEntry
from mcp_celery.store.schema import Keys, as_text

__all__ = ["BUCKETS_S", "GROUP", "DeploymentCollector", "DeploymentFigures", "JobFigures", "broker_queues"]

logger = logging.getLogger(__name__)

#: The consumer group of every server replica on the ended stream.
GROUP = "mcp-celery-figures"
#: Histogram buckets (s): from a quick job's queue wait to a six-hour job.
BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600)


class JobFigures:
    """What this replica's share of the ended stream adds up to, in prometheus_client series of their own.

    Under `serve --workers N` (prometheus_client's multiprocess mode) each process writes its values to
    the run's files and the scrape sums every process's; alone, `families` reads them from memory.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.ended = Counter(
            "mcp_celery_tasks_ended",
            "Tasks ended, by tool and status (this replica's share of the deployment's)",
            ["tool", "status", "tool_error"],
            registry=r,
        )
        self.lost = Counter(
            "mcp_celery_tasks_lost",
            "Tasks ended failed because their worker (or message) was lost",
            ["tool"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "mcp_celery_task_queue_wait_seconds",
            "Task creation to its job's start",
            ["tool"],
            buckets=BUCKETS_S,
            registry=r,
        )
        self.run = Histogram(
            "mcp_celery_job_run_seconds", "A job's start to its end", ["tool"], buckets=BUCKETS_S, registry=r
        )
        self.input_wait = Histogram(
            "mcp_celery_task_input_wait_seconds", "Time a job waited for input", ["tool"], buckets=BUCKETS_S, registry=r
        )

    def count(self, entry: EndedEntry) -> None:
        self.ended.labels(entry.tool, entry.status, "true" if entry.tool_error else "false").inc()
        if entry.lost:
            self.lost.labels(entry.tool).inc()
        if entry.queue_wait_s is not None:
            self.queue_wait.labels(entry.tool).observe(entry.queue_wait_s)
        if entry.run_s is not None:
            self.run.labels(entry.tool).observe(entry.run_s)
        if entry.input_ms > 0:
            self.input_wait.labels(entry.tool).observe(entry.input_ms / 1000)

    def families(self) -> Iterator[Metric]:
        if os.environ.get(MULTIPROC_ENV):
            return  # the scrape's multiprocess collector reads them from the files, every process's
        yield from self.registry.collect()


class DeploymentCollector(Collector):
    """A prometheus_client collector of the figures `DeploymentFigures` keeps up to date.

    Args:
        streams: whether the store keeps the ended stream (False on a cluster: no per-job figures).
        max_age_s: the oldest snapshot still reported (older: the gauges are left out).
    """

    def __init__(self, *, streams: bool = True, max_age_s: float = 30.0) -> None:
        self.jobs = JobFigures()
        self.streams = streams
        self.max_age_s = max_age_s
        self.reporting = False
        self.snapshot: DeploymentSnapshot | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # the families vary with what Redis holds; registration need not read them

    def collect(self) -> Iterator[Metric]:
        reporting = self._fresh()
        yield GaugeMetricFamily(
            "mcp_celery_deployment_reporting",
            "1 on the one server replica that reports the mcp_celery_deployment_* gauges now (a lease in Redis)",
            value=1 if reporting is not None else 0,
        )
        if reporting is not None:
            yield from _gauges(reporting)
        if self.streams:
            yield from self.jobs.families()

    def _fresh(self) -> DeploymentSnapshot | None:
        snapshot = self.snapshot
        if not self.reporting or snapshot is None or now_ms() - snapshot.at_ms > self.max_age_s * 1000:
            return None
        return snapshot


def _gauges(snapshot: DeploymentSnapshot) -> Iterator[Metric]:
    tasks = GaugeMetricFamily(
        "mcp_celery_deployment_tasks",
        "Tasks running now on live workers, by status (working, input_required) and tool",
        labels=["status", "tool"],
    )
    for (status, tool), n in sorted(snapshot.tasks_now().items()):
        tasks.add_metric([status, tool], n)
    yield tasks
    yield GaugeMetricFamily(
        "mcp_celery_deployment_unfinished_tasks",
        "Tasks not ended that the servers watch (with a Redis broker: all of them, queued ones too)",
        value=snapshot.unfinished,
    )
    depth = GaugeMetricFamily(
        "mcp_celery_deployment_queue_depth", "Messages waiting in a broker queue", labels=["queue"]
    )
    for queue, n in sorted(snapshot.queue_depths.items()):
        depth.add_metric([queue], n)
    yield depth
    if snapshot.unacked is not None:
        yield GaugeMetricFamily(
            "mcp_celery_deployment_unacked_messages", "Messages a worker holds unacked", value=snapshot.unacked
        )
    yield GaugeMetricFamily(
        "mcp_celery_deployment_workers", "Worker processes with a live heartbeat", value=len(snapshot.workers)
    )
    yield GaugeMetricFamily(
        "mcp_celery_deployment_parked_tasks",
        "Tasks whose job is parked at an open question: input_required, holding no worker",
        value=snapshot.parked,
    )
    yield GaugeMetricFamily(
        "mcp_celery_deployment_oldest_input_wait_seconds",
        "How long the task waiting for input the longest has waited (0: none waits)",
        value=snapshot.oldest_input_wait_s(),
    )


def broker_queues(celery_tasks: Iterable[Any], broker: RedisBroker | None) -> BrokerQueues | None:
    """The lists of the queues these tools' Celery tasks are routed to, on a Redis broker (None otherwise)."""
    if broker is None:
        return None
    queues: set[str] = set()
    for task in celery_tasks:
        try:
            queues.add(queue_of(task))
        except Exception:  # noqa: BLE001 - a router we cannot follow: that queue goes uncounted
            logger.warning("task %r: cannot tell its queue; its depth is not shown", task.name, exc_info=True)
    lists = {queue: [broker.queue_key(queue, step) for step in broker.steps] for queue in queues}
    return BrokerQueues(broker.redis, lists, broker.unacked)


class DeploymentFigures:
    """One server process's reads for `DeploymentCollector`: its share of the ended stream, and the snapshot.

    Args:
        redis: the store's client.
        keys: the deployment's key names.
        reader: reads the snapshots (with the broker's queues, if any).
        refresh_s: how often the lease is renewed (or sought) and the snapshot read.
        block_s: the longest wait for new stream entries (below the client's socket timeout).
        consumer: this replica's name in the consumer group (default host:pid).
        group: the consumer group (every server replica's: `GROUP`).
        collector: the collector to keep up to date (default a new one).
    """

    def __init__(
        self,
        redis: AsyncRedis,
        keys: Keys,
        reader: DeploymentReader,
        *,
        refresh_s: float = 10.0,
        block_s: float = 1.0,
        consumer: str | None = None,
        collector: DeploymentCollector | None = None,
        group: str = GROUP,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.reader = reader
        self.refresh_s = refresh_s
        self.block_ms = int(block_s * 1000)
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_holder = os.environ.get(REPLICA_ENV) or self.consumer  # every process of a replica's
        self.collector = collector or DeploymentCollector(streams=reader.streams)
        self.collector.max_age_s = 3 * refresh_s
        self.group = group
        self._grouped = False

    @classmethod
    def for_scrapes(
        cls, redis: AsyncRedis, keys: Keys, app: Any, tasks: Iterable[Any], collector: DeploymentCollector
    ) -> DeploymentFigures | None:
        """The figures of the deployment of `app` (its tools' Celery `tasks`), kept in `collector`, which
        is added to the scrape, if the server serves /metrics; else None: a stdio server in the consumer
        group would take its share of the ended stream and show it nowhere."""
        if not metrics.enabled():
            return None
        metrics.add_collector(collector, "deployment")
        reader = DeploymentReader(redis, keys, broker_queues(tasks, RedisBroker.of_app(app)))
        return cls(redis, keys, reader, collector=collector)

    async def run(self) -> None:
        """Read the stream and refresh the snapshot until cancelled; Redis errors are logged and outlived."""
        next_refresh = 0.0
        while True:
            try:
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.refresh_s
                    await self.refresh()
                if self.reader.streams:
                    read_at = time.monotonic()
                    await self.consume()
                    # At most one read a block period, however busy: entries come in batches, so the
                    # figures cost no command per job (a read that waited its whole block took a period).
                    await anyio.sleep(max(read_at + self.block_ms / 1000 - time.monotonic(), 0))
                else:
                    await anyio.sleep(max(next_refresh - time.monotonic(), 0))
            except (RedisError, OSError):
                logger.warning("could not read the deployment's figures; trying again", exc_info=True)
                await anyio.sleep(min(self.refresh_s, 5.0))

    async def refresh(self) -> None:
        """Take or renew the lease; its holder reads a snapshot."""
        self.collector.reporting = await self._hold_lease()
        if self.collector.reporting:
            self.collector.snapshot = await self.reader.snapshot(now_ms())

    async def _hold_lease(self) -> bool:
        key, lease_ms = self.keys.figures_lease(), int(3 * self.refresh_s * 1000)
        if await self.redis.set(key, self.lease_holder, nx=True, px=lease_ms):
            return True
        holder = await self.redis.get(key)
        if holder is not None and as_text(holder) == self.lease_holder:
            await self.redis.pexpire(key, lease_ms)
            return True
        return False

    async def consume(self, block_ms: int | None = None) -> int:
        """Count the entries the group hands this replica (waiting up to `block_ms`); returns how many."""
        if not self._grouped:
            await self._create_group()
        try:
            replies: Any = await self.redis.xreadgroup(
                self.group,
                self.consumer,
                {self.keys.ended(): ">"},
                count=500,
                block=self.block_ms if block_ms is None else block_ms,
                noack=True,  # counted once read: a replica that dies loses only what it had not exported yet
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._grouped = False  # the stream was deleted (a flushed database): make it again
            return 0
        entries: list[tuple[Any, Any]] = replies[0][1] if replies else []  # RESP2: [[stream, entries]]
        for _, fields in entries:
            self.collector.jobs.count(EndedEntry.from_fields({as_text(k): as_text(v) for k, v in fields.items()}))
        return len(entries)

    async def _create_group(self) -> None:
        try:
            # From now on: what ended before the first server started is not counted.
            await self.redis.xgroup_create(self.keys.ended(), self.group, id="$", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._grouped = True

    async def aclose(self) -> None:
        broker = self.reader.broker
        if broker is not None:
            await broker.client.aclose()
