"""Jobs for the traces and JSON-logs tests, on a queue of their own (TEST_OPS_QUEUE) of the suite's broker.

With TEST_SPANS_DIR set, the process exports every span it ends to `TEST_SPANS_DIR/PID.jsonl`, one
JSON object per line (the OpenTelemetry SDK's `ReadableSpan.to_json`): the server at import, a
prefork worker's children by inheritance (a SimpleSpanProcessor keeps no thread that a fork would
lose). TEST_OTEL_CELERY=1 turns on opentelemetry-instrumentation-celery as well.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery

import mcp_celery
from mcp_celery import JobContext

BROKER = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/12")
BACKEND = os.environ.get("TEST_CELERY_BACKEND") or os.environ.get("TEST_RESULT_BACKEND", "redis://127.0.0.1:6379/13")

app = Celery("ops_jobs", broker=BROKER, backend=BACKEND)
mcp_celery.configure_app(app)
app.conf.task_default_queue = os.environ.get("TEST_OPS_QUEUE", "ops")

SECRET_FORM = {"type": "object", "properties": {"pin": {"type": "string"}}, "required": ["pin"]}


def _export_spans_to(folder: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    lock = threading.Lock()

    class JsonLines(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
            with lock, open(folder / f"{os.getpid()}.jsonl", "a") as out:
                out.write(lines)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines()))
    trace.set_tracer_provider(provider)
    if os.environ.get("TEST_OTEL_CELERY") == "1":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


if os.environ.get("TEST_SPANS_DIR"):
    _export_spans_to(Path(os.environ["TEST_SPANS_DIR"]))


@mcp_celery.tool(app)
def traced(label: str) -> str:
    """Does its work in a span of its own, a child of the job's."""
    from opentelemetry import trace

    with trace.get_tracer("tests.support.ops_jobs").start_as_current_span("inner work") as span:
        span.set_attribute("label", label)
    return f"done {label}"


@mcp_celery.tool(app)
def keep_secret(token: str, ctx: JobContext) -> dict[str, Any]:
    """Asks for a PIN, and answers with something derived from its argument and the PIN."""
    answer = ctx.elicit("Your PIN?", SECRET_FORM)
    pin = (answer.content or {}).get("pin", "")
    return {"sealed": f"{token}:{pin}:result-secret"}
