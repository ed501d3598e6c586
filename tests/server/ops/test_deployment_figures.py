"""The deployment's figures from Redis: the ended stream's counters and histograms, the snapshot, `mcp-celery top`.

A deployment of its own (a prefork worker and an HTTP server on a broker database of their own,
under a key prefix of their own), so that the figures count only this file's jobs. The test
process reads the store as another replica would (`DeploymentFigures`, with a consumer group of its
own so the server's share does not split the count) and renders the collector with
prometheus_client, parsed with its parser. On a cluster store (MCP_CELERY_TEST_STORE=cluster)
there is no ended stream: the jobs run (no CROSSSLOT), and the figures say they are absent.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mcp_celery.cli.top import NO_STREAM
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.broker import RedisBroker
from mcp_celery.server.ops.deployment_metrics import DeploymentCollector, DeploymentFigures
from mcp_celery.store.connect import async_client, redis_target
from mcp_celery.store.deployment import RECENT, BrokerQueues, DeploymentReader, DeploymentSnapshot
from mcp_celery.store.schema import Keys
from tests.conftest import STORE_MODE
from tests.support.harness import (
    ROOT,
    HttpClient,
    require_service,
    session_redis,
    start_http_server,
    start_worker,
    wait_for,
)

#: Every test here reads the figures from the store (the ACL and Cluster passes).
pytestmark = pytest.mark.store

STORE = os.environ.get("MCP_CELERY_REDIS_URL") or os.environ["TEST_RESULT_BACKEND"]
STREAMS = STORE_MODE != "cluster"
BROKER = session_redis(5)  # conftest uses 12 and 13; the client tests 14, the docs 15, the demo 8 and 9, the TLS test 6


@dataclass
class Deployment:
    prefix: str
    env: dict[str, str]
    client: HttpClient
    logs: Path

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)


@pytest.fixture(scope="module")
def deployment(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    redis.Redis.from_url(BROKER).flushdb()
    # Under mcp-celery: so the ACL pass's rule (keys mcp-celery:*) covers it.
    prefix = f"mcp-celery:figs-{uuid.uuid4().hex[:8]}"
    own = {**env, "TEST_BROKER_URL": BROKER, "MCP_CELERY_KEY_PREFIX": prefix}
    logs = tmp_path_factory.mktemp("figures")
    worker = start_worker(own, logs / "worker.log", name=f"figs-{uuid.uuid4().hex[:6]}", concurrency=2)
    url, server = start_http_server(own, logs / "server.log")
    client = HttpClient(url)
    try:
        yield Deployment(prefix, own, client, logs)
    finally:
        client.close()
        server.stop()
        worker.stop()


class Figures:
    """The collector as a replica of its own would keep it, read in the test process."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.group = f"test-{uuid.uuid4().hex[:8]}"
        self.collector = DeploymentCollector(streams=STREAMS)
        self.drain()  # the group starts here: only what ends from now on counts

    def _run(self, work: Any) -> Any:
        async def run() -> Any:
            client = async_client(redis_target(STORE))
            try:
                reader = DeploymentReader(client, self.keys)
                figures = DeploymentFigures(
                    client, self.keys, reader, consumer="test", collector=self.collector, group=self.group
                )
                return await work(figures)
            finally:
                await client.aclose()

        return asyncio.run(run())

    def drain(self) -> None:
        async def drain(figures: DeploymentFigures) -> None:
            if figures.reader.streams:
                while await figures.consume(block_ms=50):
                    pass

        self._run(drain)

    def refresh(self) -> None:
        async def refresh(figures: DeploymentFigures) -> None:
            await figures.refresh()

        self._run(refresh)

    def refresh_after_freeing_the_lease(self) -> bool:
        """Delete the lease and refresh on the same connection at once; whether this replica took it (the
        server, refreshing every 10 s, can still win the race on a loaded machine)."""

        async def refresh(figures: DeploymentFigures) -> bool:
            await figures.redis.delete(self.keys.figures_lease())
            await figures.refresh()
            return figures.collector.reporting

        return bool(self._run(refresh))

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        self.drain()
        registry = CollectorRegistry()
        registry.register(self.collector)
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def snapshot(keys: Keys) -> DeploymentSnapshot:
    """What the store (and the deployment's broker, kombu's default layout) holds now."""

    async def read() -> DeploymentSnapshot:
        client = async_client(redis_target(STORE))
        broker = RedisBroker(async_client(redis_target(BROKER)), {})
        queues = {q: [broker.queue_key(q, step) for step in broker.steps] for q in ("celery", "later", "doomed")}
        try:
            reader = DeploymentReader(client, keys, BrokerQueues(broker.redis, queues, broker.unacked))
            return await reader.snapshot(now_ms(), RECENT)
        finally:
            await client.aclose()
            await broker.aclose()

    return asyncio.run(read())


def ended(tool: str, status: str, tool_error: bool = False) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"tool": tool, "status": status, "tool_error": "true" if tool_error else "false"}
    return ("mcp_celery_tasks_ended_total", tuple(sorted(labels.items())))


def by_tool(name: str, tool: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, (("tool", tool),))


def markers() -> Any:
    from tests.support.sample_jobs import markers as client

    return client


def wait_input_required(client: HttpClient, task_id: str) -> dict[str, Any]:
    return wait_for(lambda: t if (t := client.get(task_id))["status"] == "input_required" else None, 30)


def scraped(deployment: Deployment) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the deployment's server's own GET /metrics, parsed by prometheus_client."""
    reply = httpx.get(deployment.client.url.removesuffix("/mcp") + "/metrics", timeout=10)
    assert reply.status_code == 200, reply.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def test_a_scripted_run_moves_the_counters_and_histograms_exactly(deployment: Deployment) -> None:
    figures = Figures(deployment.keys)
    served_before = scraped(deployment)  # the module's other tests share the server: its deltas count
    c = deployment.client
    completed = [c.start("echo", {"text": t}) for t in ("a", "b")]
    tool_error = c.start("boom", {"message": "kaboom-figures"})
    protocol = c.start("protocol_fail")
    lost = c.start("die")  # its pool process dies: Celery reports WorkerLostError
    for task_id in [*completed, tool_error, protocol, lost]:
        c.wait(task_id, timeout=30)
    marker = f"figs-{uuid.uuid4()}"
    running = c.start("noting_loop", {"seconds": 60, "marker": marker})
    wait_for(lambda: markers().get(marker) is not None, 30, what="the loop to start")
    c.result("tasks/cancel", {"taskId": running})
    unstarted = c.start("queued_elsewhere", {"marker": marker})  # queue `later`: no worker here takes it
    c.result("tasks/cancel", {"taskId": unstarted})
    asking = c.start("ask_one", elicitation={})
    key = next(iter(wait_input_required(c, asking)["inputRequests"]))
    waiting = ("input_required", "ask_one")
    wait_for(lambda: snapshot(deployment.keys).tasks_now()[waiting] == 1, 20, what="the worker's beat to show the wait")
    answer = {"action": "accept", "content": {"confirm": True}}
    c.result("tasks/update", {"taskId": asking, "inputResponses": {key: answer}})
    for task_id in (running, unstarted, asking):
        assert c.wait(task_id, timeout=30)["status"] in {"cancelled", "completed"}

    if not STREAMS:
        samples = figures.samples()
        assert not [name for name, _ in samples if name.startswith(("mcp_celery_tasks_", "mcp_celery_job_"))]
        return
    expected = {
        ended("echo", "completed"): 2,
        ended("boom", "completed", tool_error=True): 1,
        ended("protocol_fail", "failed"): 1,
        ended("die", "failed"): 1,
        ended("noting_loop", "cancelled"): 1,
        ended("queued_elsewhere", "cancelled"): 1,
        ended("ask_one", "completed"): 1,
        by_tool("mcp_celery_tasks_lost_total", "die"): 1,
    }

    def counted() -> dict[Any, float] | None:
        samples = figures.samples()
        return samples if all(samples.get(k) == v for k, v in expected.items()) else None

    samples = wait_for(counted, 30, what=f"the counters to reach {expected}")

    # The server's own /metrics (its consumer group's share, the only replica here) moved the same way.
    def served() -> dict[Any, float] | None:
        now = scraped(deployment)
        moved = {k: now.get(k, 0.0) - served_before.get(k, 0.0) for k in expected}
        return moved if moved == expected else None

    wait_for(served, 30, what=f"the server's /metrics to move by {expected}")
    assert sum(v for (name, _), v in samples.items() if name == "mcp_celery_tasks_ended_total") == 8
    assert sum(v for (name, _), v in samples.items() if name == "mcp_celery_tasks_lost_total") == 1
    # The jobs that started and ended themselves: one queue wait and one run time each.
    started = {"echo": 2, "boom": 1, "protocol_fail": 1, "noting_loop": 1, "ask_one": 1}
    for name in ("mcp_celery_task_queue_wait_seconds_count", "mcp_celery_job_run_seconds_count"):
        seen = {dict(labels)["tool"]: v for (n, labels), v in samples.items() if n == name}
        assert seen == started, (name, seen)
    assert samples[by_tool("mcp_celery_job_run_seconds_sum", "noting_loop")] > 0
    # Only the job that asked waited for input, for at least the time until its worker's beat showed it.
    waits = {
        dict(labels)["tool"]: v for (n, labels), v in samples.items() if n == "mcp_celery_task_input_wait_seconds_count"
    }
    assert waits == {"ask_one": 1}
    assert samples[by_tool("mcp_celery_task_input_wait_seconds_sum", "ask_one")] > 0
    bucket = ("mcp_celery_task_input_wait_seconds_bucket", (("le", "+Inf"), ("tool", "ask_one")))
    assert samples[bucket] == 1
    # The recent failures carry their reasons.
    reasons = {e.tool: e.reason for e in snapshot(deployment.keys).recent_failures(20)}
    assert "kaboom-figures" in reasons["boom"] and "bad thing" in reasons["protocol_fail"]
    assert "worker running the job was lost" in reasons["die"]


def test_a_worker_killed_whole_counts_one_lost_task_once(deployment: Deployment) -> None:
    figures = Figures(deployment.keys)
    doomed = start_worker(
        deployment.env, deployment.logs / "doomed.log", queues="doomed", name=f"d-{uuid.uuid4().hex[:6]}"
    )
    try:
        marker = f"figs-{uuid.uuid4()}"
        task_id = deployment.client.start("doomed_loop", {"seconds": 120, "marker": marker})
        wait_for(lambda: markers().get(marker) == b"1", 30, what="the job to start")
        os.killpg(doomed.pid, signal.SIGKILL)  # parent and pool: the heartbeat stops, a server reports it
        assert deployment.client.wait(task_id, timeout=40)["status"] == "failed"
    finally:
        doomed.stop()
    if not STREAMS:
        pytest.skip("the store is a Redis Cluster: no ended stream, so no lost count (the task's failure was checked)")
    lost, failed = by_tool("mcp_celery_tasks_lost_total", "doomed_loop"), ended("doomed_loop", "failed")
    samples = wait_for(lambda: s if (s := figures.samples()).get(lost) == 1 else None, 30, what="the lost count")
    assert samples[failed] == 1
    assert by_tool("mcp_celery_job_run_seconds_count", "doomed_loop") not in samples  # its run time is unknown
    deployment.client.get(task_id)  # read again: frozen, nothing more is counted
    assert figures.samples()[lost] == 1


def test_only_the_replica_holding_the_lease_reports_the_deployment_gauges(deployment: Deployment) -> None:
    """The deployment's server holds the lease (it refreshes every 10 s); a second replica reports nothing."""
    figures = Figures(deployment.keys)
    wait_for(lambda: redis_for_store().exists(deployment.keys.figures_lease()), 20, what="the server's lease")
    figures.refresh()
    samples = figures.samples()
    assert samples[("mcp_celery_deployment_reporting", ())] == 0
    assert not [name for name, _ in samples if name.startswith("mcp_celery_deployment_") and "reporting" not in name]
    # Once the lease is free, the next replica to refresh takes it and reports the whole deployment.
    # A worker process says it is there from its first job on (its heartbeat starts with that job).
    assert deployment.client.wait(deployment.client.start("echo", {"text": "x"}), timeout=30)["status"] == "completed"
    workers = wait_for(lambda: len(snapshot(deployment.keys).workers), 30, what="the worker's presence")
    wait_for(figures.refresh_after_freeing_the_lease, 30, what="this replica to take the freed lease")
    samples = figures.samples()
    assert samples[("mcp_celery_deployment_reporting", ())] == 1
    assert samples[("mcp_celery_deployment_workers", ())] == workers


def redis_for_store() -> Any:
    from tests.support.sample_jobs import (
        markers as admin,  # the store's Redis (a cluster client in that pass), as an admin
    )

    return admin


def first_rows(text: str) -> dict[str, list[str]]:
    """The table rows of a frame by their first word; the first row wins (a tool shows again under ENDED)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("  ") and line.split():
            rows.setdefault(line.split()[0], line.split()[1:])
    return rows


def top_env(deployment: Deployment) -> dict[str, str]:
    return {**deployment.env, "PYTHONPATH": str(ROOT)}


def test_top_once_prints_what_the_store_holds(deployment: Deployment) -> None:
    c = deployment.client
    asking = c.start("ask_one", elicitation={})
    wait_input_required(c, asking)
    wait_for(lambda: snapshot(deployment.keys).tasks_now()[("input_required", "ask_one")] == 1, 20, what="the beat")
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "top", "-A", "tests.support.sample_jobs", "--once"],
        env=top_env(deployment), cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    try:
        seen = snapshot(deployment.keys)
        rows = first_rows(out)
        assert rows["ask_one"] == ["0", "1"], out
        assert f"WORKERS  {len(seen.workers)} live" in out, out
        assert rows["later"] == [str(seen.queue_depths["later"])], out
        assert f"unfinished (watched) {seen.unfinished}" in out, out
        assert (NO_STREAM in out) == (not STREAMS), out
    finally:
        key = next(iter(c.get(asking).get("inputRequests", {"k": 0})))
        c.call("tasks/update", {"taskId": asking, "inputResponses": {key: {"action": "decline"}}})


def test_top_runs_live_in_a_terminal_and_quits_on_q(deployment: Deployment, tmp_path: Path) -> None:
    require_service("tmux", None if shutil.which("tmux") else "tmux is not on PATH")
    c = deployment.client
    asking = c.start("ask_one", elicitation={})
    wait_input_required(c, asking)
    wait_for(lambda: snapshot(deployment.keys).tasks_now()[("input_required", "ask_one")] == 1, 20, what="the beat")
    script = tmp_path / "top.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in top_env(deployment).items() if k.isidentifier())
    command = f"exec {sys.executable} -m mcp_celery top -A tests.support.sample_jobs --interval 0.3"
    script.write_text(f"{exports}cd {shlex.quote(str(ROOT))}\n{command}\n")
    session = f"top-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "60", f"sh {script}"], check=True)
    try:

        def screen() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

        def shows_the_store() -> str | None:
            text, seen = screen(), snapshot(deployment.keys)
            rows = first_rows(text)
            ok = (
                rows.get("ask_one") == ["0", str(seen.tasks_now()[("input_required", "ask_one")])]
                and f"WORKERS  {len(seen.workers)} live" in text
                and asking in text  # the oldest waiting for input
                and ("kaboom-figures" in text or not STREAMS or "RECENT FAILURES" in text)
            )
            return text if ok else None

        text = wait_for(shows_the_store, 30, what="top to show the store's numbers")
        assert "q: quit" in text and (NO_STREAM in text) == (not STREAMS), text
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        gone = lambda: subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0  # noqa: E731
        wait_for(gone, 10, what="top to quit on q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        key = next(iter(c.get(asking).get("inputRequests", {"k": 0})))
        c.call("tasks/update", {"taskId": asking, "inputResponses": {key: {"action": "decline"}}})
