"""The demo jobs, shipped inside the package so that `mcp-celery demo` runs from a plain install.

Job code (worker tier: celery, never `mcp`). `register(app)` adds the demo tools to any Celery
app (the `jobs` package serves them beside the real jobs); this module's own `app` is what
`mcp-celery demo` runs: `celery -A mcp_celery.cli.demo_jobs worker` and
`mcp-celery serve -A mcp_celery.cli.demo_jobs`. The broker and result backend come from
CELERY_BROKER_URL and CELERY_RESULT_BACKEND.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from typing_extensions import TypedDict

from mcp_celery.cli import release_job
from mcp_celery.worker import JobContext, configure_app, expose, tool

__all__ = ["TrainingReport", "app", "register"]


class TrainingReport(TypedDict):
    epochs: int
    accuracy: float
    published: bool


def register(app: Celery) -> None:
    """Add the demo tools (`slow_compute`, `train`, `count_words`) to `app`."""

    @tool(app)
    def slow_compute(ctx: JobContext, seconds: float, label: str = "") -> str:
        """Count for a while, reporting progress every half second."""
        steps = max(int(seconds * 2), 1)
        for i in range(steps):
            ctx.status(f"step {i + 1}/{steps}")
            ctx.sleep(seconds / steps)
        return f"{label or 'job'} done after {seconds:g} s"

    @tool(app, task_mode="required")
    def train(ctx: JobContext, epochs: int = 3) -> TrainingReport:
        """Train a (pretend) model, then ask whether to publish it. The real one is jobs/training.py."""
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

    @app.task(bind=True, name="mcp_celery.cli.demo_jobs.count_words", shared=False)  # registered per app
    def count_words(self, text: str) -> int:  # type: ignore[no-untyped-def]
        """An ordinary Celery task that reports progress the usual Celery way."""
        words = text.split()
        for i, _ in enumerate(words):
            self.update_state(state="PROGRESS", meta={"current": i + 1, "total": len(words)})
            time.sleep(0.05)
        return len(words)

    # An existing task, its code unchanged, exposed as the MCP tool "count_words".
    expose(count_words)


app = Celery(
    "mcp_celery.cli.demo_jobs",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
configure_app(app)
register(app)
# The demo's step 6. A plain `register` leaves it out: the `jobs` app registers the release itself.
release_job.register(app, park_after_s=0)
