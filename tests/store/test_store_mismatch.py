"""One store, checked: a worker whose MCP_CELERY_REDIS_URL is not the servers' refuses their jobs, saying so.

The session's server creates the task in the session's store; a prefork worker started with another
MCP_CELERY_REDIS_URL (a database of its own) takes the job's message from the queue the main worker
does not consume. It finds no record of the task in its store, and the message names another store,
so it refuses the job with a Celery failure naming both; the server reads that failure from Celery's
result backend and ends the task `failed` with the worker's words within seconds, instead of
reporting the message lost a minute later. Each process names its store when it starts.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import redis

from mcp_celery.core.binding import store_identity
from mcp_celery.store.connect import redis_target
from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, session_redis, start_worker

#: The other worker's store: a database nothing else in the suite uses.
OTHER_STORE = session_redis(3)


def test_a_worker_with_another_store_refuses_the_job_and_the_task_fails_within_seconds(
    env: dict[str, str], worker: Process, client: HttpClient, http_url: str, logs: Path
) -> None:
    other_env = {**env, "MCP_CELERY_REDIS_URL": OTHER_STORE}
    stranger = start_worker(other_env, logs / "other-store-worker.log", queues="later", name=f"other-{os.getpid()}")
    marker = f"mismatch-{uuid.uuid4()}"
    try:
        started = time.monotonic()
        task_id = client.start("queued_elsewhere", {"marker": marker})  # queue "later": only the stranger takes it
        task = client.wait(task_id, timeout=20)
        took = time.monotonic() - started
    finally:
        stranger.stop()
        redis.Redis.from_url(OTHER_STORE).flushdb()
    ours = store_identity(redis_target(sample_jobs.STORE), "mcp-celery")
    theirs = store_identity(redis_target(OTHER_STORE), "mcp-celery")
    assert task["status"] == "failed", task
    assert took < 10, f"the task ended {took:.1f} s after its creation"
    message = task["error"]["message"]
    assert message.startswith(f"worker other-{os.getpid()}@") and "uses another task store" in message, message
    assert "set MCP_CELERY_REDIS_URL (and MCP_CELERY_KEY_PREFIX) the same on servers and workers" in message
    assert f"the task's server: store {ours}" in message and f"store {theirs}" in message, message
    assert OTHER_STORE in message and "from MCP_CELERY_REDIS_URL" in message, message
    assert not sample_jobs.markers.exists(marker)  # the job's body never ran
    assert sample_jobs.app.backend.get_task_meta(task_id)["status"] == "FAILURE"
    # Each process named its store at start: the stranger its own, the session's server the servers'.
    assert f"task store {OTHER_STORE} (from MCP_CELERY_REDIS_URL), key prefix 'mcp-celery', store {theirs}" in (
        stranger.output()
    )
    assert f"store {ours}" in (logs / "http-server.log").read_text()
