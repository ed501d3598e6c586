"""The Celery app the benchmark runs: `noop` as an mcp-celery tool, `raw_noop` as a plain Celery task,
`stamps`, a tool that reports the time as its status (for `python -m bench.push`), `output_stamps`, the
same as live output (for `python -m bench.live_output`), `ask_one`, a tool
that asks its client one question (for `python -m bench.input_latency` and the cancel phase),
`spin`, a tool that runs until it is cancelled (the cancel phase), and `ask_blocking` / `ask_parking`,
one question then one status, the first waiting for its answer in the worker process, the second
parking at once (for `python -m bench.parking`), and `write_artifact`, a tool that hands over a file of
random bytes as an artifact (for `python -m bench.artifact_download`).

All share one app and so one configuration (`mcp_celery.configure_app`): raw Celery is measured with
the same worker settings as ours. Broker and backend are db 0 of BENCH_REDIS_URL (set by `python -m
bench`), unless BENCH_BROKER_URL / BENCH_BACKEND_URL name other databases.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from celery import Celery

import mcp_celery

REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
BROKER = os.environ.get("BENCH_BROKER_URL", f"{REDIS}/0")
BACKEND = os.environ.get("BENCH_BACKEND_URL", f"{REDIS}/0")
CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}

app = Celery("bench_jobs", broker=BROKER, backend=BACKEND)
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


@mcp_celery.tool(app)
def output_stamps(ctx: mcp_celery.JobContext, count: int = 100, interval_s: float = 0.3, wait_s: float = 1.0) -> int:
    """Writes the wall clock as a line of live output `count` times, after `wait_s` (bench.live_output)."""
    time.sleep(wait_s)  # the listeners subscribe meanwhile
    for _ in range(count):
        ctx.output(f"t={time.time():.6f}")
        time.sleep(interval_s)
    return count


@mcp_celery.tool(app, task_mode="required")
def ask_one(ctx: mcp_celery.JobContext, timeout: float = 30) -> str:
    """Ask for a confirmation, then answer how it went (the input round trip the probe times)."""
    answer = ctx.elicit("Publish the model?", CONFIRM, timeout=timeout)
    if answer.action != "accept":
        return f"user chose {answer.action}"
    return "published" if (answer.content or {}).get("confirm") else "kept"


@mcp_celery.tool(app)
def spin(ctx: mcp_celery.JobContext, interval_s: float = 0.02, seconds: float = 60) -> int:
    """Busy until cancelled, with a cancel checkpoint every `interval_s`; returns the checkpoints passed."""
    deadline = time.monotonic() + seconds
    checkpoints = 0
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        checkpoints += 1
        time.sleep(interval_s)
    return checkpoints


def _ask_then_status(ctx: mcp_celery.JobContext, timeout: float) -> str:
    answer = ctx.elicit("Publish the model?", CONFIRM, timeout=timeout)
    ctx.status("answered")  # the job's next status after the answer: what bench.parking times
    return "published" if answer.action == "accept" and (answer.content or {}).get("confirm") else "kept"


@mcp_celery.tool(app, task_mode="required", park_after_s=None)
def ask_blocking(ctx: mcp_celery.JobContext, timeout: float = 600) -> str:
    """Ask, wait for the answer in the worker process (never parks), then report a status."""
    return _ask_then_status(ctx, timeout)


@mcp_celery.tool(app, task_mode="required", park_after_s=0)
def ask_parking(ctx: mcp_celery.JobContext, timeout: float = 600) -> str:
    """Ask and park at once (the answer runs the job again from the top), then report a status."""
    return _ask_then_status(ctx, timeout)


@mcp_celery.tool(app)
def write_artifact(ctx: mcp_celery.JobContext, mb: int = 100, name: str = "blob.bin") -> dict[str, int]:
    """Writes `mb` MB (10**6 bytes each) of random bytes to a file and hands it over as the artifact `name`
    with `ctx.artifact(name, path=...)` (bench.artifact_download downloads it)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        with path.open("wb") as file:
            for _ in range(mb):
                file.write(os.urandom(10**6))
        link = ctx.artifact(name, path=path, mime_type="application/octet-stream")
    return {"size": int(link["size"])}
