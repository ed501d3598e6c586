"""`train_model` (jobs/training.py) when its whole worker dies: the server re-queues the job once its
heartbeat runs out (MCP_CELERY_WORKER_LOST_TIMEOUT_S, 6 s in the suite), not after the Redis broker's
visibility timeout (12 h), and another worker resumes it from its last checkpoint.

Its own workers and server for `-A jobs`, on databases 10 and 11 of the test Redis, like test_training.py.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import HttpClient, start_http_server, start_jobs_worker, wait_for
from tests.support.harness import jobs_env as jobs_env_for

EPOCH_STATUS = re.compile(r"epoch (\d+)/(\d+), val accuracy (0\.\d{3}|1\.000)")
ARGUMENTS = {"samples": 60_000, "epochs": 8, "patience": 8, "min_delta": 0.0}


def epoch_of(task: dict[str, Any]) -> int | None:
    match = EPOCH_STATUS.fullmatch(task.get("statusMessage") or "")
    return int(match.group(1)) if match else None


def test_a_job_whose_whole_worker_is_killed_runs_again_elsewhere_from_its_checkpoint(
    env: dict[str, str], tmp_path: Path
) -> None:
    jobs_env = jobs_env_for(env, JOBS_ARTIFACT_DIR=str(tmp_path / "artifacts"))
    first = start_jobs_worker(jobs_env, tmp_path / "first-worker.log", "lost-whole")
    url, server = start_http_server(jobs_env, tmp_path / "server.log", app="jobs")
    mcp = HttpClient(url)
    second = None
    try:
        task_id = mcp.start("train_model", ARGUMENTS, elicitation={})
        observed = wait_for(lambda: (epoch_of(mcp.get(task_id)) or 0) >= 2 and epoch_of(mcp.get(task_id)), 90, 0.01)
        first.kill(signal.SIGKILL)  # the main process and its pool, as a lost machine would go
        killed_at = time.monotonic()
        assert observed < ARGUMENTS["epochs"], "the job finished before its worker could be killed"
        second = start_jobs_worker(jobs_env, tmp_path / "second-worker.log", "takes-over")

        asked = mcp.wait(task_id, {"input_required", "completed", "failed", "cancelled"}, timeout=120)
        assert asked["status"] == "input_required", asked  # never failed: it ran again on the second worker
        resumed_after = time.monotonic() - killed_at
        assert task_id in second.output()  # the second worker received it
        ((key, _),) = asked["inputRequests"].items()
        answer = {"action": "accept", "content": {"save": False}}
        mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
        task = mcp.wait(task_id, timeout=60)
        assert task["status"] == "completed", task
        result = task["result"]["structuredContent"]
        assert observed <= result["resumed_from_epoch"] < ARGUMENTS["epochs"], (observed, result)
        assert [e["epoch"] for e in result["history"]] == list(range(1, ARGUMENTS["epochs"] + 1))
        # The heartbeat timeout (6 s here) and a few epochs, not the visibility timeout.
        assert resumed_after < 120
    finally:
        mcp.close()
        server.stop()
        for worker in (first, second):
            if worker is not None:
                worker.stop()


pytestmark = pytest.mark.timeout(300)
