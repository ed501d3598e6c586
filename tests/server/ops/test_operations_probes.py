"""Probes and the server's own metrics, against real server processes, the suite's prefork worker and Redis.

`/readyz` is watched while a private redis-server holding the store is stopped and started again.
The metrics tests run servers of their own (so every count starts at zero): one with two server
processes, static tokens and a metrics token, read with prometheus_client's own parser.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from mcp_celery.server.edge import tokens
from mcp_celery.server.ops import metrics
from mcp_celery.server.ops.deployment_metrics import DeploymentCollector
from mcp_celery.settings import Settings
from mcp_celery.store.ended import EndedEntry
from mcp_celery.testing.processes import free_port, wait_for
from tests.support.harness import HttpClient, PersistentRedis, Process, live_processes, start_http_server

METRICS_TOKEN = "scrape-secret-7f3a"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def base_url(mcp_url: str) -> str:
    return mcp_url.removesuffix("/mcp")


def scrape(url: str, token: str | None = METRICS_TOKEN) -> Samples:
    """Every sample of GET /metrics, parsed by prometheus_client: (sample name, labels) -> value."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=")
    return _parsed(reply.content)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


class CountingClient(HttpClient):
    """An HttpClient that counts the requests it sends, per method, and opens a connection for each
    (so that the server processes sharing the port all get some)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        super().__init__(url, token)
        self.sent: Counter[str] = Counter()

    def post(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        self.sent[method] += 1
        self.close()
        return super().post(method, params, **kw)


# ---------------------------------------------------------------- probes


def test_readyz_turns_503_naming_redis_while_the_store_is_down_and_200_once_it_is_back(
    env: dict[str, str], own_redis: PersistentRedis, tmp_path: Path
) -> None:
    # The broker stays the session's Redis: only the store goes away, and only it may be named.
    own = {**env, "MCP_CELERY_REDIS_URL": f"{own_redis.url}/0", "MCP_CELERY_PROBE_TIMEOUT_S": "1"}
    url, server = start_http_server(own, tmp_path / "server.log")
    base = base_url(url)
    try:
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})

        own_redis.stop()
        down = wait_for(lambda: (r := httpx.get(f"{base}/readyz", timeout=10)).status_code == 503 and r, 20)
        assert down.json() == {"status": "not ready", "failed": {"redis": "no answer"}}
        assert str(own_redis.port) not in down.text and "redis://" not in down.text
        assert down.elapsed.total_seconds() < 3  # bounded by the probe timeout, not by redis-py's retries
        health = httpx.get(f"{base}/healthz", timeout=10)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})  # the process still serves

        own_redis.start()
        back = wait_for(lambda: (r := httpx.get(f"{base}/readyz", timeout=10)).status_code == 200 and r, 20)
        assert back.json() == {"status": "ready"}
        assert "not ready: redis: no answer" in server.output() and "ready again: redis" in server.output()
    finally:
        server.stop()


def test_readyz_names_the_broker_when_only_the_broker_is_down(
    env: dict[str, str], own_redis: PersistentRedis, tmp_path: Path
) -> None:
    own = {**env, "TEST_BROKER_URL": f"{own_redis.url}/0", "MCP_CELERY_PROBE_TIMEOUT_S": "1"}
    url, server = start_http_server(own, tmp_path / "server.log")
    try:
        assert httpx.get(f"{base_url(url)}/readyz", timeout=10).status_code == 200
        own_redis.stop()
        down = wait_for(lambda: (r := httpx.get(f"{base_url(url)}/readyz", timeout=10)).status_code == 503 and r, 20)
        assert down.json() == {"status": "not ready", "failed": {"broker": "no answer"}}
    finally:
        server.stop()


def test_probes_need_no_token_and_pass_no_host_check(auth_metrics_url: str) -> None:
    base = base_url(auth_metrics_url)
    # A kubelet sends the pod's address as Host, and no bearer token.
    for path in ("/healthz", "/readyz"):
        reply = httpx.get(f"{base}{path}", headers={"Host": "10.1.2.3:8000"}, timeout=10)
        assert reply.status_code == 200, (path, reply.text)
    assert httpx.post(f"{base}/readyz", timeout=10).status_code == 405
    assert httpx.post(base + "/mcp", json={}, timeout=10).status_code == 401  # the MCP endpoint still needs one


# ---------------------------------------------------------------- metrics: two processes, authentication


@pytest.fixture(scope="module")
def static_token(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("metrics-tokens") / "tokens"
    return path, tokens.new_token("metrics-user", path)


@pytest.fixture(scope="module")
def auth_metrics_server(
    env: dict[str, str], worker: Process, logs: Path, static_token: tuple[Path, str]
) -> Iterator[tuple[str, Process]]:
    own = {**env, "MCP_CELERY_AUTH_TOKENS": str(static_token[0]), "MCP_CELERY_METRICS_TOKEN": METRICS_TOKEN}
    url, server = start_http_server(own, logs / "metrics-server.log", "--workers", "2")
    yield url, server
    server.stop()


@pytest.fixture(scope="module")
def auth_metrics_url(auth_metrics_server: tuple[str, Process]) -> str:
    return auth_metrics_server[0]


def multiprocess_dir(server: Process) -> Path | None:
    """The per-run directory `serve --workers 2` made for prometheus_client, read from a child's environment."""
    for pid, _, parent, _ in live_processes():
        if parent != server.pid:
            continue
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
                return Path(entry.split(b"=", 1)[1].decode())
    return None


def test_metrics_count_a_scripted_run_summed_over_two_server_processes(
    auth_metrics_server: tuple[str, Process], static_token: tuple[Path, str]
) -> None:
    url, server = auth_metrics_server
    client = CountingClient(url, static_token[1])
    try:
        echoes = [client.start("echo", {"text": f"m{i}"}) for i in range(3)]
        boom = client.start("boom", {"message": "planned"})
        plain = client.result("tools/call", {"name": "echo", "arguments": {"text": "plain"}}, capabilities={})
        assert plain["content"][0]["text"] == "plain"
        for task_id in [*echoes, boom]:
            client.wait(task_id, timeout=30)
        unknown = client.call("tasks/get", {"taskId": "no-such-task"})
        assert "error" in unknown
        invalid = client.result("tools/call", {"name": "echo", "arguments": {"wrong": 1}})
        assert invalid["isError"] is True
        # Fresh connections until both server processes have served (each then has files of its own).
        folder = wait_for(lambda: multiprocess_dir(server), 10)

        def both_served() -> bool:
            client.get(echoes[0])
            return len({f.stem.rsplit("_", 1)[-1] for f in folder.glob("counter_*.db")}) >= 2

        wait_for(both_served, 30, 0.01, "both server processes to count a request")
        tasks_get_ok = client.sent["tasks/get"] - 1  # all but the unknown id

        samples = scrape(base_url(url))
    finally:
        client.close()

    assert value(samples, "mcp_celery_tasks_created_total", tool="echo") == 4  # three tasks and the plain call
    assert value(samples, "mcp_celery_tasks_created_total", tool="boom") == 1
    assert value(samples, "mcp_celery_requests_total", method="tools/call", outcome="task") == 4
    assert value(samples, "mcp_celery_requests_total", method="tools/call", outcome="result") == 1
    assert value(samples, "mcp_celery_requests_total", method="tools/call", outcome="tool_error") == 1
    assert value(samples, "mcp_celery_requests_total", method="tasks/get", outcome="ok") == tasks_get_ok
    assert value(samples, "mcp_celery_requests_total", method="tasks/get", outcome="error") == 1
    assert value(samples, "mcp_celery_tool_call_seconds_count", tool="echo", answer="task") == 3
    assert value(samples, "mcp_celery_tool_call_seconds_count", tool="boom", answer="task") == 1
    handle_le_10s = value(samples, "mcp_celery_tool_call_seconds_bucket", tool="echo", answer="task", le="10.0")
    assert handle_le_10s == 3
    assert 0 < value(samples, "mcp_celery_tool_call_seconds_sum", tool="echo", answer="task") < 30
    assert value(samples, "mcp_celery_listen_streams") == 0


def test_auth_failures_are_counted_by_reason(auth_metrics_url: str) -> None:
    before = scrape(base_url(auth_metrics_url))
    for token in (None, None, "not-a-token"):
        nobody = HttpClient(auth_metrics_url, token)
        try:
            assert nobody.post("tasks/get", {"taskId": "x"}).status_code == 401
        finally:
            nobody.close()
    after = scrape(base_url(auth_metrics_url))
    for reason, expected in (("missing", 2), ("rejected", 1)):
        counted = value(after, "mcp_celery_auth_failures_total", reason=reason)
        assert counted - value(before, "mcp_celery_auth_failures_total", reason=reason) == expected


def test_metrics_need_the_metrics_token_when_one_is_set(auth_metrics_url: str, static_token: tuple[Path, str]) -> None:
    base = base_url(auth_metrics_url)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {static_token[1]}"}):
        reply = httpx.get(f"{base}/metrics", headers=headers, timeout=10)
        assert reply.status_code == 401 and "mcp_celery_" not in reply.text, headers
    assert value(scrape(base), "mcp_celery_tasks_created_total", tool="no-such-tool") == 0  # the right one reads


def test_the_per_run_directory_is_removed_when_the_server_stops(
    env: dict[str, str], worker: Process, tmp_path: Path
) -> None:
    url, server = start_http_server(env, tmp_path / "server.log", "--workers", "2")
    folder = wait_for(lambda: multiprocess_dir(server), 10)
    assert folder.is_dir()
    server.stop()
    assert not folder.exists()


# ---------------------------------------------------------------- metrics: listen streams, another port, off


def test_open_listen_streams_are_a_gauge(env: dict[str, str], worker: Process, tmp_path: Path) -> None:
    url, server = start_http_server(env, tmp_path / "server.log")
    client = HttpClient(url)
    try:
        task_id = client.start("slow_greeting", {"name": "ada", "seconds": 60})
        stream = client.stream("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
        assert stream.next() is not None  # acknowledged: the stream is open
        assert wait_for(lambda: value(scrape(base_url(url), None), "mcp_celery_listen_streams") == 1, 10)
        stream.close()  # the client goes away
        assert wait_for(lambda: value(scrape(base_url(url), None), "mcp_celery_listen_streams") == 0, 10)
        client.result("tasks/cancel", {"taskId": task_id})
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_port_serves_metrics_and_probes_and_the_mcp_port_no_metrics(
    env: dict[str, str], worker: Process, tmp_path: Path, workers: str
) -> None:
    """With two server processes, the metrics port is served by the process that started them, summing theirs."""
    port = free_port()
    url, server = start_http_server(env, tmp_path / "server.log", "--metrics-port", str(port), "--workers", workers)
    client = HttpClient(url)
    try:
        client.wait(client.start("echo", {"text": "counted"}))
        other = f"http://127.0.0.1:{port}"
        assert value(scrape(other, None), "mcp_celery_tasks_created_total", tool="echo") == 1
        assert httpx.get(f"{other}/readyz", timeout=10).json() == {"status": "ready"}
        assert httpx.get(f"{other}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{other}/mcp", timeout=10).status_code == 404  # no MCP there
        assert httpx.get(f"{base_url(url)}/metrics", timeout=10).status_code != 200
    finally:
        client.close()
        server.stop()


def test_a_metrics_port_that_cannot_be_served_stops_serve_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = "tests.support.sample_jobs"
        args = ["serve", "-A", app, "--http", "--port", str(free_port()), "--metrics-port", str(port)]
        done = subprocess.run([sys.executable, "-m", "mcp_celery", *args], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"mcp-celery: cannot serve --metrics-port {port} on 127.0.0.1" in done.stderr.decode()


def test_with_metrics_off_there_is_no_metrics_endpoint(env: dict[str, str], worker: Process, tmp_path: Path) -> None:
    url, server = start_http_server({**env, "MCP_CELERY_METRICS": "false"}, tmp_path / "server.log")
    client = HttpClient(url)
    try:
        assert client.wait(client.start("echo", {"text": "uncounted"}))["status"] == "completed"
        reply = httpx.get(f"{base_url(url)}/metrics", timeout=10)
        assert reply.status_code != 200 and "mcp_celery_" not in reply.text
        assert httpx.get(f"{base_url(url)}/healthz", timeout=10).status_code == 200
    finally:
        client.close()
        server.stop()


# ---------------------------------------------------------------- the hooks other parts record through


class _OneFigure:
    """A collector as the deployment-wide one is: read at scrape time, in the scraping process."""

    def __init__(self) -> None:
        self.scrapes = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.scrapes += 1
        yield GaugeMetricFamily("mcp_celery_test_figure", "A figure read at scrape time.", value=self.scrapes)


def test_the_hooks_and_an_added_collector_show_in_the_exposition() -> None:
    """In this process: what `record_*` records, the deployment collector's counts of ended tasks and an
    added collector's figure reach `/metrics`'s text."""
    was_on = metrics.enabled()
    metrics.configure(Settings(metrics=True))
    try:
        before = _parsed(metrics.exposition())
        metrics.record_created("echo")
        deployment = DeploymentCollector()
        metrics.add_collector(deployment, "deployment")  # as a running server's is (TaskService.running)
        # Created at 0, started 0.3 s later, waited 40 s for input, ended 42.3 s after its creation.
        ended = EndedEntry("t1", "echo", "failed", 1_000, 43_300, started_ms=1_300, input_ms=40_000, lost=True)
        deployment.jobs.count(ended)
        collector = _OneFigure()
        metrics.add_collector(collector)
        after = _parsed(metrics.exposition())
    finally:
        metrics.configure(Settings(metrics=was_on))
    moved = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    assert moved[("mcp_celery_tasks_created_total", frozenset({("tool", "echo")}))] == 1
    labels = frozenset({("tool", "echo"), ("status", "failed"), ("tool_error", "false")})
    assert moved[("mcp_celery_tasks_ended_total", labels)] == 1
    assert moved[("mcp_celery_tasks_lost_total", frozenset({("tool", "echo")}))] == 1
    assert moved[("mcp_celery_task_queue_wait_seconds_bucket", frozenset({("tool", "echo"), ("le", "0.5")}))] == 1
    assert ("mcp_celery_task_queue_wait_seconds_bucket", frozenset({("tool", "echo"), ("le", "0.1")})) not in moved
    assert moved[("mcp_celery_job_run_seconds_sum", frozenset({("tool", "echo")}))] == 42.0
    assert moved[("mcp_celery_task_input_wait_seconds_count", frozenset({("tool", "echo")}))] == 1
    assert after[("mcp_celery_test_figure", frozenset())] == 1 and collector.scrapes == 1


def _parsed(text: bytes) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }
