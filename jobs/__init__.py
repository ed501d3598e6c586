"""Real jobs served as MCP tools: `celery -A jobs worker` and `mcp-celery serve -A jobs`.

The Celery app reads CELERY_BROKER_URL and CELERY_RESULT_BACKEND from the environment, like
`jobs/demo.py`. Each job module registers its tools on this one app; importing the package
imports them all.
"""

from __future__ import annotations

import os

from celery import Celery

import mcp_celery

app = Celery(
    "jobs",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
mcp_celery.configure_app(app)

__all__ = ["app"]

import jobs.code_review  # noqa: E402, F401  (registers code_review on `app`)
import jobs.logs  # noqa: E402, F401  (registers log_search on `app`)
import jobs.release  # noqa: E402
import jobs.sweep  # noqa: E402, F401  (registers train_sweep on `app`)
import jobs.training  # noqa: E402, F401  (registers train_model on `app`)
from mcp_celery.cli.demo_jobs import register as _register_demo_tools  # noqa: E402

_register_demo_tools(app)  # slow_compute, train, count_words
jobs.release.register(app)  # release
