"""The server's own Prometheus series, and the one scrape that reads them.

Server tier (prometheus_client). The HTTP server turns them on (`configure`); until then, and
with MCP_CELERY_METRICS=false, every `record_*` / `observe_*` call returns at once, so the stdio
server and a server with metrics off pay one flag test per call.

Under `serve --http --workers N` each process counts its own and the scrape sums them:
prometheus_client's multiprocess mode, where every process writes its values to memory-mapped files
in PROMETHEUS_MULTIPROC_DIR (a directory of its own per run, made by `mcp-celery serve`) and the
process answering `/metrics` reads all of them. The open listen streams gauge is summed over the
live processes only (`livesum`). A single process keeps its values in memory.

The series are built on first use, not at import (in multiprocess mode building one opens its file).
Figures for the whole deployment (tasks by status now, queue depths, and the ended tasks' counts and
times) are `mcp_celery.server.ops.deployment_metrics`', added to the scrape with `add_collector`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.registry import Collector

from mcp_celery.settings import Settings

__all__ = [
    "MULTIPROC_ENV",
    "PREFIX",
    "add_collector",
    "configure",
    "enabled",
    "exposition",
    "listen_stream",
    "measured",
    "measured_tool_call",
    "process_stopped",
    "record_auth_failure",
    "record_created",
    "record_deduplicated",
    "record_request",
]

PREFIX = "mcp_celery_"
#: Where prometheus_client's multiprocess mode keeps the values; set before any server process starts.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The server replica's id, shared by its processes under `--workers N` (set by `mcp-celery serve`):
#: any of them may answer a scrape, so the deployment gauges' lease is the replica's, not a process's.
REPLICA_ENV = "MCP_CELERY_REPLICA_ID"

#: Seconds: from a millisecond `tasks/get` to a slow `tools/call` on a loaded broker.
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

R = TypeVar("R")

_on = False
_extra: dict[str, Collector] = {}
_scrape: CollectorRegistry | None = None


@dataclass(frozen=True)
class _Series:
    created: Counter
    deduplicated: Counter
    requests: Counter
    tool_call: Histogram
    listen_streams: Gauge
    auth_failures: Counter


_REGISTRY = CollectorRegistry(auto_describe=True)


@functools.cache
def _series() -> _Series:
    """The series, built once per process (in this module's own registry, so that building several
    servers in one process never registers a name twice)."""
    r = _REGISTRY
    return _Series(
        created=Counter(f"{PREFIX}tasks_created", "Tasks created, per tool.", ["tool"], registry=r),
        deduplicated=Counter(
            f"{PREFIX}deduplicated",
            "tools/call answered with the task of an earlier call instead of a new one, per tool and by what "
            "(key: the same idempotency key, window: the same call within the tool's dedupe window).",
            ["tool", "by"],
            registry=r,
        ),
        requests=Counter(
            f"{PREFIX}requests", "JSON-RPC requests, per method and outcome.", ["method", "outcome"], registry=r
        ),
        tool_call=Histogram(
            f"{PREFIX}tool_call_seconds",
            "tools/call handling time until the answer (for a task: its handle), per tool and answer.",
            ["tool", "answer"],
            buckets=CALL_BUCKETS,
            registry=r,
        ),
        listen_streams=Gauge(
            f"{PREFIX}listen_streams", "Open subscriptions/listen streams.", registry=r, multiprocess_mode="livesum"
        ),
        auth_failures=Counter(
            f"{PREFIX}auth_failures",
            "Requests refused with HTTP 401, per reason (missing, rejected).",
            ["reason"],
            registry=r,
        ),
    )


# ---------------------------------------------------------------- switching on, scraping


def configure(settings: Settings) -> None:
    """Turn the series on or off for this process (MCP_CELERY_METRICS); the HTTP server calls it."""
    global _on
    _on = settings.metrics


def enabled() -> bool:
    return _on


def add_collector(collector: Collector, name: str | None = None) -> None:
    """Add a collector to every later scrape: figures read at scrape time, such as the deployment's
    tasks by status from Redis. It runs in the process answering `/metrics` only, once per scrape.
    One collector per `name`: a later one replaces the earlier (a process that builds its server again).
    """
    key = name or f"collector-{id(collector)}"
    earlier = _extra.get(key)
    _extra[key] = collector
    if _scrape is not None:
        if earlier is not None:
            _scrape.unregister(earlier)
        _scrape.register(collector)


def _scrape_registry() -> CollectorRegistry:
    global _scrape
    if _scrape is None:
        if os.environ.get(MULTIPROC_ENV):
            registry = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:
            _series()  # a series never touched is still shown, at zero
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_REGISTRY)
        for collector in _extra.values():
            registry.register(collector)
        _scrape = registry
    return _scrape


def exposition() -> bytes:
    """The Prometheus text exposition of every series (summed over the server's processes) and of
    the added collectors. Blocking (files, the collectors' own I/O): call it on a thread."""
    return generate_latest(_scrape_registry())


def process_stopped() -> None:
    """Drop this process's live gauges from the multiprocess sum (called as its server stops)."""
    if _on and os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------- recording

# The labelled children of the series on every request's path, looked up once per label set:
# prometheus_client's `labels()` checks and locks on each call, three times the cost of the `inc()`.
# The label values are bounded (tools served, methods, outcomes), and so are these caches.


@functools.cache
def _created(tool: str) -> Any:
    return _series().created.labels(tool)


@functools.cache
def _requests(method: str, outcome: str) -> Any:
    return _series().requests.labels(method, outcome)


@functools.cache
def _tool_call(tool: str, answer: str) -> Any:
    return _series().tool_call.labels(tool, answer)


def record_created(tool: str) -> None:
    """A task was created for `tool` (its record written and its job queued)."""
    if _on:
        _created(tool).inc()


def record_deduplicated(tool: str, by: str) -> None:
    """A call of `tool` got an earlier call's task (`by` "key" or "window") instead of a new one."""
    if _on:
        _series().deduplicated.labels(tool, by).inc()


def record_request(method: str, outcome: str) -> None:
    """A JSON-RPC request of `method` was answered with `outcome` (ok, error, or for tools/call the answer)."""
    if _on:
        _requests(method, outcome).inc()


def record_auth_failure(reason: str) -> None:
    """A request was refused with HTTP 401: no bearer token (`missing`) or one no verifier accepted (`rejected`)."""
    if _on:
        _series().auth_failures.labels(reason).inc()


@contextmanager
def listen_stream() -> Iterator[None]:
    """Counts an open `subscriptions/listen` stream for as long as the block runs."""
    if not _on:
        yield
        return
    gauge = _series().listen_streams
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def measured(method: str, handler: Callable[[Any, Any], Awaitable[R]]) -> Callable[[Any, Any], Awaitable[R]]:
    """Wrap a request handler so each request counts in `requests{method, outcome}` (ok or error)."""

    @functools.wraps(handler)
    async def counted(ctx: Any, params: Any) -> R:
        if not _on:
            return await handler(ctx, params)
        outcome = "error"  # a JSON-RPC error, whatever the exception the SDK turns into one
        try:
            result = await handler(ctx, params)
            outcome = "ok"
            return result
        finally:
            _requests(method, outcome).inc()

    return counted


def measured_tool_call(
    handler: Callable[[Any, Any], Awaitable[R]], tool_label: Callable[[str], str]
) -> Callable[[Any, Any], Awaitable[R]]:
    """Wrap the `tools/call` handler: `requests{tools/call, answer}` and `tool_call_seconds{tool, answer}`,
    where the answer is task (a handle), result, tool_error, input_required or error (JSON-RPC).

    `tool_label` maps the requested name to the label: only names the server serves become labels,
    so a client cannot grow the series by calling made-up tools.
    """

    @functools.wraps(handler)
    async def timed(ctx: Any, params: Any) -> R:
        if not _on:
            return await handler(ctx, params)
        started = time.perf_counter()
        answer = "error"
        try:
            result = await handler(ctx, params)
            answer = _answer_kind(result)
            return result
        finally:
            _tool_call(tool_label(params.name), answer).observe(time.perf_counter() - started)
            _requests("tools/call", answer).inc()

    return timed


def _answer_kind(result: Any) -> str:
    if isinstance(result, dict):
        kind, is_error = result.get("resultType"), result.get("isError")
    else:
        kind, is_error = getattr(result, "result_type", None), getattr(result, "is_error", None)
    if kind in ("task", "input_required"):
        return str(kind)
    return "tool_error" if is_error else "result"
