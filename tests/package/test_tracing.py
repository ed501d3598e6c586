"""Traces from an MCP request into its Celery job, across a real server and a real prefork worker.

Each process exports its spans through the OpenTelemetry SDK to a JSON-lines file of its own
(`tests.support.ops_jobs`); the test joins them by trace id and walks the parent links from the job's
spans back to the client's. Two set-ups: our own propagation alone, and with
opentelemetry-instrumentation-celery turned on in both processes.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_celery.tracing import STATUS, TASK_ID, TOOL
from tests.support.harness import ROOT, HttpClient, start_http_server, start_worker, wait_for

pytest.importorskip("opentelemetry.sdk.trace", reason="the [otel] extra is not installed")

Spans = dict[str, dict[str, Any]]


@pytest.fixture(scope="module", params=["ours", "celery-instrumented"])
def traced(
    request: pytest.FixtureRequest, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, HttpClient, Path]]:
    """A server and a prefork worker of `tests.support.ops_jobs`, both exporting spans to one folder."""
    mode = str(request.param)
    folder = tmp_path_factory.mktemp(f"spans-{mode}")
    ops_env = {
        **env,
        "TEST_SPANS_DIR": str(folder),
        "TEST_OPS_QUEUE": f"ops-{mode}",
        "TEST_OTEL_CELERY": "1" if mode == "celery-instrumented" else "0",
    }
    queue = f"ops-{mode}"
    worker = start_worker(ops_env, folder / "worker.log", queues=queue, name=queue, app="tests.support.ops_jobs")
    try:
        url, server = start_http_server(ops_env, folder / "server.log", app="tests.support.ops_jobs")
        client = HttpClient(url)
        try:
            yield mode, client, folder
        finally:
            client.close()
            server.stop()
    finally:
        worker.stop()


def spans_of(folder: Path, trace_id: str) -> Spans:
    """Every span the processes exported so far in trace `trace_id` (hex), by span id."""
    found: Spans = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            span = json.loads(line)
            if span["context"]["trace_id"] == f"0x{trace_id}":
                found[span["context"]["span_id"]] = span
    return found


def chain(spans: Spans, span: dict[str, Any]) -> list[dict[str, Any]]:
    """`span` and its ancestors among `spans`, nearest first."""
    out = [span]
    while out[-1]["parent_id"] in spans:
        out.append(spans[out[-1]["parent_id"]])
    return out


def named(spans: Spans, name: str) -> dict[str, Any] | None:
    return next((s for s in spans.values() if s["name"] == name), None)


def run_traced(client: HttpClient, folder: Path, *, via: str) -> tuple[str, str, str, Spans]:
    """Call `traced` with a client trace context in `_meta` or in the HTTP headers; wait for its spans."""
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    context = {"traceparent": f"00-{trace_id}-{client_span}-01"}
    kw: dict[str, Any] = {"meta": context} if via == "meta" else {"headers": context}
    result = client.result("tools/call", {"name": "traced", "arguments": {"label": via}}, **kw)
    task_id = str(result["taskId"])
    assert client.wait(task_id)["status"] == "completed"

    def complete() -> Spans | None:
        """The spans once the chain from the job's inner span reaches the request's (each is exported as it ends)."""
        spans = spans_of(folder, trace_id)
        inner = named(spans, "inner work")
        return spans if inner is not None and chain(spans, inner)[-1]["name"] == "tools/call traced" else None

    return trace_id, client_span, task_id, wait_for(complete, 20, what="the job's and the request's spans")


@pytest.mark.parametrize("via", ["meta", "headers"])
def test_the_job_spans_are_children_of_the_mcp_request_span(traced: tuple[str, HttpClient, Path], via: str) -> None:
    mode, client, folder = traced
    _, client_span, task_id, spans = run_traced(client, folder, via=via)
    inner = named(spans, "inner work")
    assert inner is not None
    names = [span["name"] for span in chain(spans, inner)]
    expected = ["inner work", "mcp_celery.job traced", "tools/call traced"]
    if mode == "celery-instrumented":  # Celery's own spans sit between the request's and the job's
        expected[2:2] = ["run/tests.support.ops_jobs.traced", "apply_async/tests.support.ops_jobs.traced"]
    assert names == expected
    call = named(spans, "tools/call traced")
    job = named(spans, "mcp_celery.job traced")
    assert call is not None and job is not None
    assert call["parent_id"] == f"0x{client_span}"  # the client's context, from _meta or the headers
    assert call["kind"] == "SpanKind.SERVER"
    assert call["attributes"][TASK_ID] == task_id and call["attributes"][STATUS] == "working"
    assert job["attributes"] == {TASK_ID: task_id, TOOL: "traced", STATUS: "completed"}
    assert job["kind"] == ("SpanKind.INTERNAL" if mode == "celery-instrumented" else "SpanKind.CONSUMER")
    # Server and worker spans come from different processes: the chain crossed the broker.
    files = {path.name for path in folder.glob("*.jsonl") if task_id in path.read_text()}
    assert len(files) >= 2


#: Run first in the probe's interpreter: OpenTelemetry cannot be imported there, as without the extra.
HIDE_OPENTELEMETRY = """
import sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
        return None
sys.meta_path.insert(0, Hidden())
"""


def test_the_worker_tier_and_a_job_need_no_opentelemetry() -> None:
    """Without OpenTelemetry the worker tier and job modules import, the tracing hooks do nothing, and
    nothing of OpenTelemetry is loaded. (redis-py 8 loads it on its own where it is installed; the MCP
    SDK, and so the server tier, depends on opentelemetry-api.)"""
    probe = HIDE_OPENTELEMETRY + (
        "import mcp_celery.worker, mcp_celery.worker.execution, tests.support.ops_jobs, tests.support.sample_jobs\n"
        "from mcp_celery import tracing\n"
        "assert tracing.message_headers() == {} and not tracing.loaded()\n"
        "with tracing.job_span(object(), 'echo', 'task-1'):\n"
        "    tracing.annotate('task-1', 'echo', 'completed')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
        "print('mcp_celery.worker.logsetup' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded, probed = out.stdout.strip().splitlines()[-2:]
    assert loaded == "[]"
    assert probed == "True"  # the worker tier really was imported
