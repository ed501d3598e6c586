"""A workflow's speed-up: `python -m bench.workflow [--rounds N] [--samples N] [--out FILE]`.

`train_sweep` (jobs/sweep.py) over four grid points on one prefork worker of two processes,
against the same four runs one after another (four sweeps of one point each, so every run costs
the same: one training run and one merge step), in the same run and on the same worker and
server, interleaved round by round. Each time is from the task's creation to the merge step's
question, by the task's own timestamps (`createdAt`, and `lastUpdatedAt` as it asks): the runs are
over by then, the question is answered at once and the task's end waited for outside the timing.
The client polls only every quarter second, so that it takes no CPU from the runs, and the
interval does not count in the times. Goal: the sweep takes at most 0.6x the time of the runs in sequence. Writes
bench/results-workflow.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.procs import BENCH, PY, CpuProbe, start, start_http_server
from bench.redis_tools import BenchRedis
from bench.rpc import TASKS_EXT, SyncClient
from mcp_celery.testing.processes import free_port, wait_for

GOAL = 0.6
POINTS = 4
POLL_S = 0.25
ENDED = {"completed", "failed", "cancelled"}


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def wait(client: SyncClient, task_id: str, until: set[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (task := client.get(task_id))["status"] not in until:
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task_id} still {task['status']} after {timeout} s")
        time.sleep(POLL_S)
    return task


def sweep(client: SyncClient, seeds: list[int], samples: int, epochs: int) -> float:
    """Seconds from the creation of a sweep over `seeds` to its merge step's question."""
    arguments = {"grid": {"seed": seeds}, "epochs": epochs, "samples": samples, "features": 20, "patience": epochs}
    task_id = client.start("train_sweep", arguments)
    waiting = wait(client, task_id, {"input_required", *ENDED}, timeout=600)
    elapsed = _seconds(waiting["lastUpdatedAt"]) - _seconds(waiting["createdAt"])
    if waiting["status"] != "input_required":
        raise RuntimeError(f"the sweep ended {waiting['status']} before asking: {waiting}")
    (key,) = waiting["inputRequests"]
    answer = {"action": "decline"}
    client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}, task_id)
    done = wait(client, task_id, ENDED, timeout=60)
    if done["status"] != "completed":
        raise RuntimeError(f"the sweep ended {done['status']}: {done}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.workflow")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=250_000, help="generated examples per run")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--out", default=str(BENCH / "results-workflow.md"))
    a = ap.parse_args()
    rds = BenchRedis()
    rds.start()
    env = {
        "CELERY_BROKER_URL": f"{rds.url}/0",
        "CELERY_RESULT_BACKEND": f"{rds.url}/1",
        "JOBS_ARTIFACT_DIR": tempfile.mkdtemp(prefix="bench-workflow-"),
    }
    celery = [PY, "-m", "celery", "-A", "jobs", "worker", "-P", "prefork", "-c", "2", "--without-gossip"]
    worker = start("worker-workflow", [*celery, "--without-mingle", "-l", "INFO", "-n", "bench-workflow@%h"], env)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = start_http_server("server-workflow", [PY, "-m", "mcp_celery", "serve", "-A", "jobs", "--http",
                               "--port", str(port)], url, env)  # fmt: skip
    parallel: list[float] = []
    sequential: list[float] = []
    try:
        client = SyncClient(url, {"extensions": {TASKS_EXT: {}}, "elicitation": {}})
        wait_for(lambda: "ready." in worker.output(), 60, 0.1, "the worker")
        sweep(client, [0], a.samples, 1)  # warm-up: imports, the first dataset
        before = CpuProbe.sample()
        for _ in range(a.rounds):
            parallel.append(sweep(client, list(range(POINTS)), a.samples, a.epochs))
            sequential.append(sum(sweep(client, [seed], a.samples, a.epochs) for seed in range(POINTS)))
            print(f"round: sweep {parallel[-1]:.2f} s, in sequence {sequential[-1]:.2f} s", file=sys.stderr)
        foreign = CpuProbe.foreign(before, CpuProbe.sample())
        client.close()
    finally:
        server.stop()
        worker.stop()
        rds.stop()
    ratio = statistics.median(parallel) / statistics.median(sequential)
    verdict = "MET" if ratio <= GOAL else "MISSED"
    text = "\n".join(
        [
            "# Workflow: a sweep across two worker processes against the same runs in sequence",
            "",
            f"`python -m bench.workflow --rounds {a.rounds} --samples {a.samples} --epochs {a.epochs}`: `train_sweep` "
            f"over {POINTS} grid points on one prefork worker of two processes, against the same {POINTS} runs one "
            "after another (one-point sweeps), interleaved round by round; each time from the task's creation to the "
            f"merge step's question, by its own timestamps. Other processes used {foreign:.0%} of the machine's CPU "
            "meanwhile.",
            "",
            "| | median s | rounds |",
            "|---|---|---|",
            f"| the sweep ({POINTS} runs in parallel) | {statistics.median(parallel):.2f} | "
            + ", ".join(f"{t:.2f}" for t in parallel)
            + " |",
            f"| the same runs in sequence | {statistics.median(sequential):.2f} | "
            + ", ".join(f"{t:.2f}" for t in sequential)
            + " |",
            "",
            f"{verdict}  the sweep ≤ {GOAL}x the runs in sequence: {ratio:.2f}x",
            "",
        ]
    )
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
