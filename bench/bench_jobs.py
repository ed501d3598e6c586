"""The Celery app the benchmark runs: `noop` as an mcp-celery tool and `raw_noop` as a plain Celery task.

Both share one app and so one configuration (`mcp_celery.configure_app`): raw Celery is measured with
the same worker settings as ours. Broker and backend come from BENCH_REDIS_URL (set by `python -m bench`).
"""

from __future__ import annotations

import os
import time

from celery import Celery

import mcp_celery

REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")

app = Celery("bench_jobs", broker=f"{REDIS}/0", backend=f"{REDIS}/0")
mcp_celery.configure_app(app)


@mcp_celery.tool(app)
def noop(x: int = 0) -> int:
    return x


@app.task
def raw_noop(x: int) -> int:
    return x


@mcp_celery.tool(app)
def stamps(ctx: mcp_celery.JobContext, count: int = 100, interval_s: float = 0.02) -> int:
    """Reports the wall clock as its status `count` times (bench.push measures the push delay with it)."""
    for _ in range(count):
        ctx.status(f"t={time.time():.6f}")
        time.sleep(interval_s)
    return count
