"""The real jobs' workflows: `train_sweep` (jobs/sweep.py) and a sharded `log_search` (jobs/logs.py).

Through a real `mcp-celery serve --http -A jobs` and a prefork `celery -A jobs worker` of two processes;
the sharded search against the single-process search of the same files, in this process.
"""

from __future__ import annotations

import base64
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import joblib
import pytest
import redis

from jobs._logfilters import LineFilter
from jobs._logsearch import Query, search
from jobs.sweep import run_model_name
from jobs.training import make_dataset
from tests.support.harness import (
    HttpClient,
    Process,
    caps,
    session_redis,
    start_http_server,
    start_jobs_worker,
    wait_for,
)
from tests.support.harness import jobs_env as jobs_env_for
from tests.support.logdata import log_lines, write

#: The sharded search's shard size here: the log root below holds about 1.2 MB, so about 5 shards.
SHARD_BYTES = 250_000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logs = tmp_path_factory.mktemp("shard-root")
    for i in range(8):
        write(logs / f"app/part-{i}.log", log_lines(1500, seed=100 + i), gz=i % 3 == 2)
    return logs


@pytest.fixture(scope="module")
def jobs_env(env: dict[str, str], root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    artifacts = tmp_path_factory.mktemp("artifacts")
    # The sweep's merge step parks at its save question at once: the answer resumes it on any worker.
    return jobs_env_for(
        env,
        JOBS_LOG_ROOT=str(root),
        JOBS_LOG_SHARD_BYTES=str(SHARD_BYTES),
        JOBS_ARTIFACT_DIR=str(artifacts),
        MCP_CELERY_PARK_AFTER_S="0",
    )


@pytest.fixture(scope="module")
def jobs_client(jobs_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpClient]:
    logs = tmp_path_factory.mktemp("job-workflows")
    worker: Process = start_jobs_worker(jobs_env, logs / "worker.log", "workflows")
    url, server = start_http_server(jobs_env, logs / "server.log", app="jobs")
    client = HttpClient(url)
    yield client
    client.close()
    server.stop()
    worker.stop()


def test_a_search_over_more_than_the_shard_size_is_sharded_and_counts_as_one_process_would(
    jobs_client: HttpClient, root: Path
) -> None:
    pattern = r"latency_ms=1[0-9]{3}\b"
    task_id = jobs_client.start("log_search", {"paths": "app/*", "pattern": pattern, "regex": True, "max_matches": 7})
    done = jobs_client.wait(task_id, timeout=120)
    assert done["status"] == "completed", done
    sharded = done["result"]["structuredContent"]
    alone = search(root, "app/*", Query(pattern, True, LineFilter.build(None, None, None), 7), workers=1)
    assert sharded["shards"] > 1, sharded
    assert (sharded["total_matches"], sharded["files"], sharded["bytes_scanned"]) == (
        alone.total_matches,
        alone.files,
        alone.bytes_scanned,
    )
    assert [(m["file"], m["line_number"], m["line"]) for m in sharded["matches"]] == [
        (m.file, m.line_number, m.line) for m in alone.matches
    ]


def test_a_sweep_trains_every_grid_point_across_the_workers_and_saves_the_best_once_asked(
    jobs_client: HttpClient, jobs_env: dict[str, str]
) -> None:
    grid = {"hidden_units": [4, 16], "alpha": [0.0001, 0.01]}
    arguments = {"grid": grid, "epochs": 3, "samples": 4000, "features": 8}
    task_id = jobs_client.start("train_sweep", arguments, elicitation={})
    seen: list[str] = []

    def asked() -> dict[str, object] | None:
        task = jobs_client.get(task_id)
        seen.append(str(task.get("statusMessage", "")))
        return None if task["status"] == "working" else task

    waiting = wait_for(asked, 180, 0.05, "the sweep to ask whether to save")
    assert waiting["status"] == "input_required", waiting
    (key,) = waiting["inputRequests"]
    assert key == "merge/elicit-1" and "4 runs done" in waiting["inputRequests"][key]["params"]["message"]
    records = redis.Redis.from_url(session_redis(11))
    parked = lambda: [m for m in records.zrange("mcp-celery:parked", 0, -1) if m.decode().startswith(f"{task_id}.")]  # noqa: E731
    wait_for(parked, 30, 0.05, "the merge step to park")
    answer = {"action": "accept", "content": {"save": True}}
    jobs_client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}, capabilities=caps())
    done = jobs_client.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    result = done["result"]["structuredContent"]
    assert sorted(tuple(sorted(r["params"].items())) for r in result["runs"]) == sorted(
        (("alpha", a), ("hidden_units", h)) for a in grid["alpha"] for h in grid["hidden_units"]
    )
    assert all(r["worker"] and r["pid"] > 0 for r in result["runs"])  # who trained each run
    best = max(result["runs"], key=lambda r: r["best_val_accuracy"])
    assert result["best"] == best and result["saved"] is True and result["failed"] == []
    assert os.path.exists(result["artifact_path"])
    assert any(re.match(r"\d/4 runs done, \d running", m) for m in seen), seen  # the tool's own summary
    links = {b["name"]: b for b in done["result"]["content"] if b["type"] == "resource_link"}  # each run's model
    assert sorted(links) == sorted(run_model_name(r["params"]) for r in result["runs"]), done["result"]["content"]
    best_link = links[run_model_name(best["params"])]
    read = jobs_client.result("resources/read", {"uri": best_link["uri"]}, name=best_link["uri"])
    model = joblib.load(io.BytesIO(base64.b64decode(read["contents"][0]["blob"])))
    data = make_dataset(4000, 8, 0)
    assert round(float(model.score(data.x_val, data.y_val)), 5) == best["best_val_accuracy"]
    uri = f"mcp-celery://tasks/{task_id}/output"  # every run's epochs in the sweep's one output
    output = jobs_client.result("resources/read", {"uri": uri}, name=uri)["contents"][0]["text"]
    assert sum("epoch" in line for line in output.splitlines()) == sum(r["epochs_run"] for r in result["runs"])
