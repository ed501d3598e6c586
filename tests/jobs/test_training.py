"""The `train_model` job (jobs/training.py) end to end: `celery -A jobs worker` (prefork) and
`mcp-celery serve -A jobs --http`, real Redis, real scikit-learn training on small generated data.

The jobs app reads its Redis URLs from the environment; these tests give it databases 10 (broker)
and 11 (results) of the test Redis, apart from the sample jobs' 12 and 13, and their own artifact dir.
The worker parks a job at its question at once (MCP_CELERY_PARK_AFTER_S=0): the save question ends
the run, and the answer runs the job again, which must not train again (`ctx.once`).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib
import pytest
import redis
from celery import Celery

from jobs.training import make_dataset
from tests.support.harness import HttpClient, Process, session_redis, start_http_server, start_jobs_worker, wait_for
from tests.support.harness import jobs_env as jobs_env_for

EPOCH_STATUS = re.compile(r"epoch (\d+)/(\d+), val accuracy (0\.\d{3}|1\.000)")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="module")
def jobs_env(env: dict[str, str], artifacts: Path) -> dict[str, str]:
    return jobs_env_for(env, JOBS_ARTIFACT_DIR=str(artifacts), MCP_CELERY_PARK_AFTER_S="0")


@pytest.fixture(scope="module")
def jobs_worker(jobs_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log = tmp_path_factory.mktemp("training-logs") / "worker.log"
    worker = start_jobs_worker(jobs_env, log, "training")
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def jobs_url(jobs_env: dict[str, str], jobs_worker: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("training-logs") / "server.log"
    url, server = start_http_server(jobs_env, log, app="jobs")
    yield url
    server.stop()


@pytest.fixture
def mcp(jobs_url: str) -> Iterator[HttpClient]:
    client = HttpClient(jobs_url)
    yield client
    client.close()


def start_training(mcp: HttpClient, **arguments: Any) -> str:
    return mcp.start("train_model", arguments, elicitation={})


def answer_save(mcp: HttpClient, task_id: str, save: bool) -> dict[str, Any]:
    """Wait for the save question, answer it, and return the question as asked."""
    task = mcp.wait(task_id, {"input_required"}, timeout=60)
    ((key, request),) = task["inputRequests"].items()
    ack = mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: accept(save)}})
    assert ack["resultType"] == "complete"
    return dict(request)


def accept(save: bool) -> dict[str, Any]:
    return {"action": "accept", "content": {"save": save}}


def structured(task: dict[str, Any]) -> dict[str, Any]:
    assert task["status"] == "completed", task
    assert not task["result"].get("isError"), task
    return dict(task["result"]["structuredContent"])


def watch_status(mcp: HttpClient, task_id: str, until: set[str], timeout: float = 60) -> list[str]:
    """Every distinct statusMessage seen while polling, until the task reaches one of `until`."""
    seen: list[str] = []

    def check() -> bool:
        task = mcp.get(task_id)
        message = task.get("statusMessage")
        if message and (not seen or seen[-1] != message):
            seen.append(message)
        return task["status"] in until

    wait_for(check, timeout, 0.02, f"{task_id} to reach {until}")
    return seen


def test_train_model_is_listed_with_an_output_schema(mcp: HttpClient) -> None:
    tools = {t["name"]: t for t in mcp.result("tools/list")["tools"]}
    tool = tools["train_model"]
    assert {"epochs", "patience", "samples"} <= set(tool["inputSchema"]["properties"])
    assert {"epochs_run", "best_val_accuracy", "stopped_early", "history", "artifact_path"} <= set(
        tool["outputSchema"]["properties"]
    )


def test_training_reports_each_epoch_asks_to_save_and_returns_metrics_and_the_best_model(
    mcp: HttpClient, artifacts: Path
) -> None:
    arguments = {"samples": 30_000, "epochs": 5, "patience": 5}
    task_id = start_training(mcp, **arguments)
    statuses = watch_status(mcp, task_id, {"input_required", "completed", "failed", "cancelled"})
    epochs_seen = [int(m.group(1)) for s in statuses if (m := EPOCH_STATUS.fullmatch(s))]
    assert epochs_seen and epochs_seen == sorted(epochs_seen), statuses
    assert all(EPOCH_STATUS.fullmatch(s) for s in statuses if s.startswith("epoch")), statuses

    records = redis.Redis.from_url(session_redis(11))
    wait_for(lambda: records.hexists(f"mcp-celery:task:{{{task_id}}}", "parked"), 30, 0.05, "the job to park")
    answered_at = datetime.now(UTC)
    question = answer_save(mcp, task_id, save=True)
    assert question["method"] == "elicitation/create"
    assert "Save the model?" in question["params"]["message"]
    result = structured(mcp.wait(task_id, timeout=60))
    # Resumed from the top, the job did not train again: every epoch ended before the answer.
    assert all(datetime.fromisoformat(e["finished_at"]) < answered_at for e in result["history"]), result

    assert result["epochs_run"] == 5 and not result["stopped_early"] and result["resumed_from_epoch"] == 0
    assert [e["epoch"] for e in result["history"]] == [1, 2, 3, 4, 5]
    best = max(result["history"], key=lambda e: e["val_accuracy"])
    assert result["best_val_accuracy"] == best["val_accuracy"] > 0.6  # four classes: chance is 0.25
    assert result["saved"] is True
    path = Path(result["artifact_path"])
    assert path.is_file() and artifacts in path.parents
    # The artifact is the best epoch's model: it scores exactly the reported accuracy on the same data.
    data = make_dataset(arguments["samples"], 40, 0)
    assert round(joblib.load(path).score(data.x_val, data.y_val), 5) == result["best_val_accuracy"]
    assert not list((artifacts / "train_model" / "checkpoints").glob("*.joblib"))  # cleaned up


def test_training_stops_early_and_saves_nothing_when_declined(mcp: HttpClient, artifacts: Path) -> None:
    # No epoch can beat the first by a whole 1.0 of accuracy: after `patience` more epochs it stops.
    task_id = start_training(mcp, samples=10_000, epochs=20, patience=2, min_delta=1.0)
    question = answer_save(mcp, task_id, save=False)
    assert "stopped early after 3 epochs" in question["params"]["message"]
    result = structured(mcp.wait(task_id, timeout=60))
    assert result["stopped_early"] is True
    assert result["epochs_run"] == 3 and result["best_epoch"] == 1 and len(result["history"]) == 3
    assert result["saved"] is False and result["artifact_path"] is None
    assert not (artifacts / "train_model" / "models" / f"{task_id}.joblib").exists()
    uri = f"mcp-celery://tasks/{task_id}/output"  # the epochs as live output, one line each
    lines = mcp.result("resources/read", {"uri": uri}, name=uri)["contents"][0]["text"].splitlines()
    assert [line.split()[1] for line in lines] == ["1/20", "2/20", "3/20"], lines
    assert lines[0].endswith("(best)") and "val_accuracy" in lines[0] and not lines[1].endswith("(best)")


def test_a_cancel_stops_training_at_the_next_epoch(mcp: HttpClient, artifacts: Path) -> None:
    task_id = start_training(mcp, samples=100_000, epochs=200, patience=200)
    wait_for(lambda: EPOCH_STATUS.fullmatch(mcp.get(task_id).get("statusMessage", "")), 60, what="an epoch")
    mcp.result("tasks/cancel", {"taskId": task_id})
    cancelled_at = time.monotonic()
    task = mcp.wait(task_id, timeout=30)
    assert task["status"] == "cancelled", task
    checkpoint = artifacts / "train_model" / "checkpoints" / f"{task_id}.joblib"
    wait_for(lambda: not checkpoint.exists(), 10, what="the checkpoint to be removed")
    # Epochs of 80,000 examples take well under a second here; the grace of the test server is 1 s,
    # so a job that ran on for the 200 epochs would have been reported cancelled by the server, not
    # by itself: Celery's own state tells them apart.
    backend = jobs_celery()  # the job stores REVOKED after it removed its checkpoint: waited for
    wait_for(lambda: backend.AsyncResult(task_id).state == "REVOKED", 10, what="Celery's REVOKED")
    assert time.monotonic() - cancelled_at < 10


def jobs_celery() -> Celery:
    """A Celery client of the jobs' broker and results (databases 10 and 11, as `jobs_env` sets them)."""
    return Celery(broker=session_redis(10), backend=session_redis(11))


def pool_pid_running(task_id: str) -> int | None:
    """The pid of the prefork pool process running `task_id`, from the worker itself (`inspect active`)."""
    control = jobs_celery()
    for tasks in (control.control.inspect(timeout=2, limit=1).active() or {}).values():
        for task in tasks:
            if task["id"] == task_id and task.get("worker_pid"):
                return int(task["worker_pid"])
    return None


def test_a_job_whose_pool_process_is_killed_resumes_at_the_epoch_after_its_last_checkpoint(
    mcp: HttpClient, jobs_worker: Process
) -> None:
    """What this shows.

    The same training runs twice with the same arguments. The first run is left alone. In the second,
    once the task's statusMessage says `epoch k/10` (k >= 2; the checkpoint of epoch k is written before
    that message), the pool process running it is SIGKILLed, as the OOM killer would. `train_model` is
    at-least-once (retry_on_worker_loss), so the worker puts the message back and runs the task again
    under the same task id. That execution:

    * reports `resumed_from_epoch` = r with k <= r < 10 (the checkpoint it loaded; r > k if the process
      wrote another checkpoint between the status poll and the kill);
    * finished epochs 1..r before the kill and r+1..10 after it (per-epoch `finished_at` timestamps),
      each exactly once: nothing before the checkpoint was trained again;
    * ends with exactly the per-epoch validation accuracies of the run that was never interrupted:
      the model, its optimizer state and its random state came back from the checkpoint, not anew.

    The MCP task never fails: it stays `working` through the loss and completes after the question.
    """
    arguments = {"samples": 120_000, "epochs": 10, "patience": 10, "min_delta": 0.0}
    undisturbed_id = start_training(mcp, **arguments)
    answer_save(mcp, undisturbed_id, save=False)
    undisturbed = structured(mcp.wait(undisturbed_id, timeout=60))

    task_id = start_training(mcp, **arguments)
    pid = wait_for(lambda: pool_pid_running(task_id), 60, 0.2, "the pool process running the job")

    def epoch_reached() -> int | None:
        task = mcp.get(task_id)
        assert task["status"] == "working", task
        match = EPOCH_STATUS.fullmatch(task.get("statusMessage", ""))
        return int(match.group(1)) if match and int(match.group(1)) >= 2 else None

    observed = wait_for(epoch_reached, 60, 0.01, "epoch 2")
    killed_at = datetime.now().astimezone()
    os.kill(pid, signal.SIGKILL)
    assert observed < 10, "the job finished before it could be killed"

    answer_save(mcp, task_id, save=False)
    result = structured(mcp.wait(task_id, timeout=60))
    resumed = result["resumed_from_epoch"]
    assert observed <= resumed < 10, (observed, result)
    assert [e["epoch"] for e in result["history"]] == list(range(1, 11))
    finished = [datetime.fromisoformat(e["finished_at"]) for e in result["history"]]
    assert all(t < killed_at for t in finished[:resumed]), (killed_at, finished)
    assert all(t > killed_at for t in finished[resumed:]), (killed_at, finished)
    accuracies = [e["val_accuracy"] for e in result["history"]]
    assert accuracies == [e["val_accuracy"] for e in undisturbed["history"]]
    assert "SIGKILL" in jobs_worker.output() and jobs_worker.alive()
