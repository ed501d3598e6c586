"""A Celery app that used pickle and defines its tools before calling `configure_app`.

Its worker consumes the queue `late-config` only, on the suite's broker. `configure_app` comes last
on purpose: the tools must get its time limits all the same, and the worker must say at start that
the app's pickle settings were replaced and which task still sends pickle.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

import mcp_celery

app = Celery(
    "late_config_jobs",
    broker=os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/12"),
    backend=os.environ.get("TEST_RESULT_BACKEND", "redis://127.0.0.1:6379/13"),
)
app.conf.update(accept_content=["json", "pickle"], task_serializer="pickle", task_default_queue="late-config")

#: The longest job: the hard limit, so the soft limit is at 90% of it.
MAX_JOB_S = 4


@mcp_celery.tool(app)
def until_told_to_stop(seconds: float) -> str:
    """Sleeps; a soft time limit makes it stop early and say so."""
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "stopped by the soft time limit"
    return "slept without a limit"


@app.task(serializer="pickle")
def legacy_pickled(value: object) -> object:
    """A plain Celery task that sends pickle: its messages are refused once configure_app runs."""
    return value


mcp_celery.configure_app(app, max_job=timedelta(seconds=MAX_JOB_S))
