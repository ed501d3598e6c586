"""The cancel phase: how soon a cancelled job stops, against the input round trip of the same rounds.

A prefork worker (-c 4) and `mcp-celery serve --http` over database 0 of the bench Redis. Each
round, one task at a time:

1. reference: a job waiting for input (`ask_one`) is answered with `tasks/update`, timed until it
   carries on (`bench.input_latency`'s round): the wake-up a cancel of a waiting job uses too;
2. another waiting job is sent `tasks/cancel`;
3. a running job with a cancel checkpoint every CANCEL_CHECKPOINT_S (`spin`) is sent `tasks/cancel`,
   at a random point of its checkpoint cycle;
4. a job parked at its question (`ask_parking`: no worker process holds it) is sent `tasks/cancel`:
   the server itself ends it and writes Celery's REVOKED.

A cancel is timed from the moment it is sent (from a second thread) to the end of the first GET of
the job's Celery result, in a tight loop meanwhile, that finds it REVOKED: the job itself saw the
cancel and stopped (the task's final state must say so too, not that the grace period ran out).
These goals used to be timings inside the tests (tests/jobs/test_logs_job.py,
tests/server/tasks/test_input_required.py, tests/worker/test_cancel.py, tests/worker/test_parking.py); the tests
now only check that the job stops (Celery's REVOKED, the task `cancelled` without the grace period's words),
with loose bounds.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

from bench.config import CANCEL_CHECKPOINT_S, RunConfig, say
from bench.input_latency import TERMINAL, Probe, serving
from bench.procs import CpuProbe
from bench.redis_tools import BenchRedis
from bench.results import Latencies, Results
from mcp_celery.store.schema import FIELD, Keys
from mcp_celery.testing.processes import wait_for

WARM_UP_ROUNDS = 2


async def run_cancel(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    await asyncio.to_thread(measure_cancel, cfg, rds, results)


def measure_cancel(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which the entry point sets

    updates: list[float] = []
    waiting: list[float] = []
    running: list[float] = []
    parked: list[float] = []
    rng = random.Random(28)  # the same phases every run
    with serving(bench_jobs.app, rds.url, "cancel", rds.client(0)) as probe:
        for _ in range(WARM_UP_ROUNDS):
            probe.one_round()
            cancel_waiting(probe)
            cancel_running(probe, rng)
            cancel_parked(probe)
        before = CpuProbe.sample()
        for _ in range(cfg.cancel_rounds):
            updates.append(probe.one_round()[0])
            waiting.append(cancel_waiting(probe))
            running.append(cancel_running(probe, rng))
            parked.append(cancel_parked(probe))
        results.foreign_cpu.append(("cancel", CpuProbe.foreign(before, CpuProbe.sample())))
    figures = results.cancel
    figures.checkpoint_ms = CANCEL_CHECKPOINT_S * 1000
    figures.input_continues, figures.waiting = Latencies.of(updates), Latencies.of(waiting)
    figures.running, figures.parked = Latencies.of(running), Latencies.of(parked)
    shown = (("update, job continues", figures.input_continues), ("cancel, waiting job", figures.waiting))
    for name, lat in (*shown, ("cancel, running job", figures.running), ("cancel, parked job", figures.parked)):
        say(f"  {name}: p50 {lat.p50_ms:.2f} ms, p95 {lat.p95_ms:.2f} ms, max {lat.max_ms:.2f} ms")


def cancel_waiting(probe: Probe) -> float:
    """Seconds from tasks/cancel to REVOKED for a job parked in its wait for an answer."""
    task_id, meta_key, _ = probe.park_a_job()
    return _cancel_until_revoked(probe, task_id, meta_key)


def cancel_running(probe: Probe, rng: random.Random) -> float:
    """Seconds from tasks/cancel to REVOKED for a job between two of its checkpoints."""
    task_id = probe.client.start("spin", {"interval_s": CANCEL_CHECKPOINT_S})
    meta_key = probe.backend.get_key_for_task(task_id)
    # A tool's Celery state skips STARTED (its record shows the job running): the job's start sets its heartbeat.
    record = Keys().task(task_id)
    wait_for(lambda: probe.results.hexists(record, FIELD.ALIVE_UNTIL), 30, 0.002, "the job to start")
    # Not a wait for anything: a cancel sent right at STARTED would always land early in the job's
    # first sleep and measure the whole interval; a random phase samples every point of the cycle.
    time.sleep(rng.uniform(0, CANCEL_CHECKPOINT_S))
    return _cancel_until_revoked(probe, task_id, meta_key)


def cancel_parked(probe: Probe) -> float:
    """Seconds from tasks/cancel to REVOKED for a job parked at its question: no worker runs it, so the
    server's cancel ends it and writes Celery's REVOKED itself."""
    task_id = probe.client.start("ask_parking", {})
    meta_key = probe.backend.get_key_for_task(task_id)
    record = Keys().task(task_id)
    wait_for(lambda: probe.results.hexists(record, FIELD.PARKED), 30, 0.002, "the job to park")
    return _cancel_until_revoked(probe, task_id, meta_key)


def _cancel_until_revoked(probe: Probe, task_id: str, meta_key: object) -> float:
    sent: dict[str, float] = {}

    def send() -> None:
        sent["t0"] = time.perf_counter()
        probe.client.result("tasks/cancel", {"taskId": task_id}, task_id)
        sent["ack"] = time.perf_counter()

    sender = threading.Thread(target=send)
    sender.start()  # the GET loop below runs while the cancel is in flight
    deadline = time.perf_counter() + 30
    while probe.meta_status(meta_key) != "REVOKED":
        if time.perf_counter() > deadline:
            raise RuntimeError(f"task {task_id}: the job did not stop within 30 s of tasks/cancel")
    stopped = time.perf_counter()
    sender.join(30)
    if "ack" not in sent:
        raise RuntimeError(f"task {task_id}: tasks/cancel got no answer")
    done = wait_for(lambda: probe.status_in(task_id, TERMINAL), 30, 0.01, "the task to end")
    if done["status"] != "cancelled" or "grace" in str(done.get("statusMessage")):
        raise RuntimeError(f"task {task_id}: not stopped by the job itself: {done}")
    return stopped - sent["t0"]
