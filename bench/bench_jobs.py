"""The Celery app the benchmark runs: `noop` as an mcp-celery tool and `raw_noop` as a plain Celery task.

Broker and backend come from BENCH_REDIS_URL (set by `python -m bench`).
"""

from __future__ import annotations

import os

from celery import Celery

REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("bench_jobs", broker=f"{REDIS}/0", backend=f"{REDIS}/0")

try:
    import mcp_celery
except ImportError:  # mcp_celery not built yet: raw Celery baseline only, with celery-notes §4 settings
    mcp_celery = None  # type: ignore[assignment]
    HAVE_MCP_CELERY = False
    app.conf.update(
        task_acks_late=False,
        worker_disable_prefetch=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        result_extended=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
    )
else:
    HAVE_MCP_CELERY = True
    mcp_celery.configure_app(app)

    @mcp_celery.tool(app)
    def noop(x: int = 0) -> int:
        return x


@app.task
def raw_noop(x: int) -> int:
    return x
