"""OpenTelemetry traces from an MCP request into its Celery job, where the process loaded OpenTelemetry.

Tier 0: nothing but the standard library at import. The MCP SDK (mcp 2.3) depends on
opentelemetry-api and opens a SERVER span for every request it serves (`tools/call NAME`), whose
parent is the trace context of the request's `_meta` (`traceparent`, `tracestate`: SEP-414). What
this module adds, the SDK cannot know:

- the trace context of the HTTP headers, for a request whose `_meta` carries none
  (`parent_from_headers`; an HTTP server span of the user's own ASGI instrumentation wins);
- the task's id, tool and status as attributes of the request's span (`annotate`);
- the trace context in the headers of the job's Celery message (`message_headers`), where the
  worker finds it, and so does opentelemetry-instrumentation-celery when the user enables it (its
  `apply_async/TASK` span, a child of the request's, then replaces the context with its own);
- the job's span in the worker (`job_span`): a child of Celery's `run/TASK` span when that
  instrumentation made one, else of the context the message carries.

Nothing here imports OpenTelemetry itself: every function acts only when something else in the
process has loaded it (the SDK on the server; in a worker, the user's tracing set-up: an SDK
tracer provider, the Celery instrumentation, `opentelemetry-instrument`). A worker nobody set up
tracing for never loads it, and each job costs it one dict lookup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = [
    "STATUS",
    "TASK_ID",
    "TOOL",
    "annotate",
    "job_span",
    "loaded",
    "message_headers",
    "parent_from_headers",
]

#: Span attributes: the task's id, its tool (the name the SDK's own span uses) and its MCP status.
TASK_ID = "mcp.task.id"
TOOL = "gen_ai.tool.name"
STATUS = "mcp.task.status"
#: The name of this library's tracer (the SDK's is "mcp-python-sdk").
TRACER = "mcp_celery"


def loaded() -> bool:
    """Whether this process has loaded OpenTelemetry's trace API (this module never loads it)."""
    return "opentelemetry.trace" in sys.modules


def message_headers() -> dict[str, str]:
    """The current trace context as Celery message headers (`traceparent`, ...); {} when there is none."""
    if not loaded():
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # writes nothing without a valid span context
    return carrier


@contextmanager
def parent_from_headers(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context of HTTP `headers` current while a request is handled.

    Only when no span is current (the user's HTTP instrumentation would have made one from the
    same headers); the SDK's request span still prefers the context of the request's `_meta`.
    """
    if headers is None or not loaded() or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context, propagate, trace

    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def annotate(task_id: str, tool: str, status: str) -> None:
    """Put the task's id, tool and status on the current span (the request's, or the job's)."""
    if not loaded():
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({TASK_ID: task_id, TOOL: tool, STATUS: status})
        if status == "failed":
            span.set_status(trace.StatusCode.ERROR)


@contextmanager
def job_span(request: Any, tool: str, task_id: str) -> Iterator[None]:
    """The span of one job's run in the worker; `request` is the Celery task's request.

    Its status attribute is set by `annotate` when the job ends. Exceptions are not recorded as
    span errors: a cancel ends a job with Celery's `Ignore`, a tool error is a completed task.
    """
    if not loaded():
        yield
        return
    from opentelemetry import propagate, trace

    parent = None
    kind = trace.SpanKind.INTERNAL  # inside Celery's `run/TASK` span, a child of the request's already
    if not trace.get_current_span().get_span_context().is_valid:
        # Celery copies a message's headers onto its request: the context the server put there.
        fields = propagate.get_global_textmap().fields
        carrier = {name: value for name in fields if isinstance(value := getattr(request, name, None), str)}
        parent, kind = propagate.extract(carrier), trace.SpanKind.CONSUMER
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(
        f"mcp_celery.job {tool}",
        context=parent,
        kind=kind,
        attributes={TASK_ID: task_id, TOOL: tool, STATUS: "working"},
        record_exception=False,
        set_status_on_exception=False,
    ):
        yield
