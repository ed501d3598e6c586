"""Demo jobs: what a team's Celery module looks like once its jobs are MCP tools.

Run a worker with `celery -A jobs.demo worker` and the MCP server with
`mcp-celery serve -A jobs.demo` (or everything at once: `mcp-celery demo`).
"""

from __future__ import annotations

import os
import time

from celery import Celery
from typing_extensions import TypedDict

import mcp_celery

app = Celery(
    "jobs.demo",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
mcp_celery.configure_app(app)


@mcp_celery.tool(app)
def slow_compute(ctx: mcp_celery.JobContext, seconds: float, label: str = "") -> str:
    """Count for a while, reporting progress every half second."""
    steps = max(int(seconds * 2), 1)
    for i in range(steps):
        ctx.status(f"step {i + 1}/{steps}")
        ctx.sleep(seconds / steps)
    return f"{label or 'job'} done after {seconds:g} s"


class TrainingReport(TypedDict):
    epochs: int
    accuracy: float
    published: bool


@mcp_celery.tool(app, task_mode="required")
def train(ctx: mcp_celery.JobContext, epochs: int = 3) -> TrainingReport:
    """Train a (pretend) model, then ask whether to publish it."""
    accuracy = 0.5
    for epoch in range(1, epochs + 1):
        ctx.status(f"epoch {epoch}/{epochs}")
        ctx.sleep(0.3)
        accuracy = round(1 - 0.5 / (epoch + 1), 3)
    answer = ctx.elicit(
        f"Accuracy {accuracy}. Publish the model?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
    )
    published = answer.action == "accept" and bool((answer.content or {}).get("confirm"))
    return {"epochs": epochs, "accuracy": accuracy, "published": published}


@app.task(bind=True)
def count_words(self, text: str) -> int:  # type: ignore[no-untyped-def]
    """An ordinary Celery task that reports progress the usual Celery way."""
    words = text.split()
    for i, _ in enumerate(words):
        self.update_state(state="PROGRESS", meta={"current": i + 1, "total": len(words)})
        time.sleep(0.05)
    return len(words)


# An existing task, its code unchanged, exposed as the MCP tool "count_words".
mcp_celery.expose(count_words)
