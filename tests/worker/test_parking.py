"""Questions that wait for people park the job (`mcp_celery.worker.parking`), on a prefork worker at -c 1.

A parked job holds no worker process: twenty jobs that ask at once are all `input_required` while the
one worker process runs a job with no question; the answers run them again from the top on any
worker (one started after the first was SIGTERMed and a second SIGKILLed while it ran a job, half the
answers given while no worker ran), each with its own answer, and the step each wraps in `ctx.once` ran once.

The store is the pass's (`tests.support.parking_jobs`): tests whose outcome depends on its scripts are marked
`store`, and run again as the ACL user and on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from mcp_celery.core.binding import AppBinding
from mcp_celery.core.status import CANCELLED_WHILE_PARKED
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.service import TaskService
from mcp_celery.settings import Settings
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.connect import async_client, redis_target
from mcp_celery.store.schema import FIELD, Lifetimes
from mcp_celery.testing.processes import wait_for
from tests.conftest import PATIENT_GRACE_S, empty_broker
from tests.support import parking_jobs
from tests.support.harness import ROOT, HttpClient, PersistentRedis, Process, caps, start_http_server, start_worker

ELICIT = caps(elicitation={})
#: Tests that look into a Redis broker (its unacked hash; the reaper's look for a message in a queue).
REDIS_BROKER_ONLY = pytest.mark.skipif(
    parking_jobs.BROKER.startswith("amqp"), reason="looks into a Redis broker's queues (the RabbitMQ pass has none)"
)
APP = "tests.support.parking_jobs"


def counted(marker: str, step: str) -> int:
    return int(parking_jobs.markers.get(f"{marker}:{step}") or 0)


@pytest.fixture(scope="module")
def parking_env(env: dict[str, str]) -> dict[str, str]:
    empty_broker(parking_jobs.BROKER, queues=(parking_jobs.QUEUE,))
    redis.Redis.from_url(parking_jobs.BACKEND).flushdb()
    # The store named explicitly: the pass's, else this app's results' Redis (a result backend pass's
    # MCP_CELERY_REDIS_URL in `env` names the session's instead).
    store = {"MCP_CELERY_REDIS_URL": parking_jobs.STORE, "MCP_CELERY_KEY_PREFIX": parking_jobs.PREFIX}
    return {**env, **store, "PARKING_BROKER_URL": parking_jobs.BROKER, "PARKING_BACKEND_URL": parking_jobs.BACKEND}


@pytest.fixture(scope="module")
def server(parking_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_http_server(parking_env, tmp_path_factory.mktemp("parking") / "server.log", app=APP)
    yield url
    proc.stop()


@pytest.fixture
def client(server: str) -> Iterator[HttpClient]:
    c = HttpClient(server)
    yield c
    c.close()


@pytest.fixture
def parking_worker(parking_env: dict[str, str], tmp_path: Path) -> Iterator[Process]:
    """A prefork worker of one process for the parking jobs, for one test (not named `worker`: the session's
    server, which a store pass checks, needs the session's)."""
    proc = one_worker(parking_env, tmp_path / "worker.log")
    yield proc
    proc.stop()


def one_worker(parking_env: dict[str, str], log: Path) -> Process:
    name = f"park-{uuid.uuid4().hex[:8]}"
    return start_worker(parking_env, log, app=APP, name=name, concurrency=1, queues=parking_jobs.QUEUE)


def start(client: HttpClient, tool: str, **arguments: Any) -> str:
    return client.start(tool, arguments, elicitation={})


def key_of(task: dict[str, Any]) -> str:
    (key,) = task["inputRequests"]
    return str(key)


def answer(client: HttpClient, task_id: str, approve: bool) -> None:
    task = client.get(task_id)
    assert task["status"] == "input_required", task
    reply = client.result(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {key_of(task): {"action": "accept", "content": {"approve": approve}}}},
        capabilities=ELICIT,
    )
    assert reply["resultType"] == "complete", reply


def wait_status(client: HttpClient, task_id: str, statuses: set[str], timeout: float = 30) -> dict[str, Any]:
    return wait_for(
        lambda: t if (t := client.get(task_id))["status"] in statuses else None, timeout, 0.05, f"{task_id} {statuses}"
    )


def parked(task_id: str) -> bool:
    """Whether the task's job is parked now (its record says so: `FIELD.PARKED`)."""
    return bool(parking_jobs.records.hexists(parking_jobs.keys.task(task_id), FIELD.PARKED))


def indexed(task_id: str) -> bool:
    """Whether the parked index (`Keys.parked`: `mcp-celery top`, the metrics) counts the task."""
    return parking_jobs.records.zscore(parking_jobs.keys.parked(), task_id) is not None


def asking_parked(client: HttpClient, task_id: str) -> bool:
    return client.get(task_id)["status"] == "input_required" and parked(task_id) and indexed(task_id)


def ask_twenty(client: HttpClient, run: str) -> list[str]:
    """Twenty parking jobs, each with its own marker `run-i`; their ids."""
    return [start(client, "park_at_once", marker=f"{run}-{i}") for i in range(20)]


def check_answered(client: HttpClient, created: list[str], run: str) -> None:
    """Every job ended completed with its own answer; its step before the question ran twice, its `once` step once."""
    for i, task_id in enumerate(created):
        task = wait_status(client, task_id, {"completed", "failed", "cancelled"})
        assert task["status"] == "completed", task
        assert task["result"]["content"][0]["text"] == f"build-1 {run}-{i} approve={i % 2 == 0}", task
        assert counted(f"{run}-{i}", "before") == 2  # asked, then resumed from the top
        assert counted(f"{run}-{i}", "once") == 1


@pytest.mark.broker
@pytest.mark.store
def test_twenty_questions_hold_no_worker_and_a_job_without_one_runs_meanwhile(
    client: HttpClient, parking_worker: Process, parking_env: dict[str, str]
) -> None:
    """One worker process asks all twenty, one after another: a job that held it while it waited for its
    answer would keep the next from ever asking (nobody answers here until all have asked)."""
    run = uuid.uuid4().hex[:8]
    created = ask_twenty(client, run)
    plain = start(client, "no_question", text="meanwhile")
    for task_id in created:
        wait_for(lambda t=task_id: asking_parked(client, t), 60, 0.05, f"{task_id} to ask and park")
    done = wait_status(client, plain, {"completed", "failed", "cancelled"})
    assert done["status"] == "completed", done
    assert all(client.get(t)["status"] == "input_required" for t in created)  # nobody answered yet
    frame = top_once(parking_env)
    assert "parked (no worker) 20" in frame and frame.count("parked, no worker") == 10, frame
    for i, task_id in enumerate(created):
        answer(client, task_id, approve=i % 2 == 0)
    check_answered(client, created, run)
    assert "parked (no worker) 0" in top_once(parking_env)


def top_once(parking_env: dict[str, str]) -> str:
    """One frame of `mcp-celery top` for the parking jobs' deployment."""
    args = [sys.executable, "-m", "mcp_celery", "top", "-A", APP, "--once"]
    done = subprocess.run(args, env=parking_env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


@pytest.mark.broker
@pytest.mark.store
def test_parked_jobs_survive_a_warm_and_a_cold_worker_stop_and_answers_given_while_no_worker_runs(
    client: HttpClient, parking_env: dict[str, str], tmp_path: Path
) -> None:
    """The cold stop SIGKILLs a worker while its one process runs a job: that job is lost with it (an
    at-most-once job ends `failed`, never run again), the parked ones, which no worker held, are not."""
    first = one_worker(parking_env, tmp_path / "first.log")
    run = uuid.uuid4().hex[:8]
    try:
        created = ask_twenty(client, run)
        for task_id in created:
            wait_for(lambda t=task_id: asking_parked(client, t), 60, 0.05, f"{task_id} to ask and park")
    finally:
        # A deploy: Celery's warm shutdown (SIGTERM to the main process, which stops its pool), with no job
        # to wait for now. (A SIGTERM to the whole process group can kill a pool process still finishing
        # the run that parked: the task stays parked all the same, `test_store`.)
        first.proc.send_signal(signal.SIGTERM)
        first.proc.wait(timeout=60)
        first.stop()  # nothing left by now; a pool process the shutdown left behind would go here
    second = one_worker(parking_env, tmp_path / "second.log")
    held = start(client, "park_at_once", marker=f"{run}-held", work_s=PATIENT_GRACE_S)  # busy long before asking
    wait_for(lambda: counted(f"{run}-held", "before") == 1, 60, 0.05, "the second worker to run a job")
    assert not parked(held)
    second.kill(signal.SIGKILL)  # a cold stop: the worker's process group, mid-job
    for i, task_id in enumerate(created[:10]):  # no worker runs at all
        answer(client, task_id, approve=i % 2 == 0)
        assert client.get(task_id)["status"] == "working"
    third = one_worker(parking_env, tmp_path / "third.log")
    try:
        for i, task_id in enumerate(created[10:], start=10):
            answer(client, task_id, approve=i % 2 == 0)
        check_answered(client, created, run)
        lost = wait_status(client, held, {"completed", "failed", "cancelled"}, timeout=60)
        assert lost["status"] == "failed" and counted(f"{run}-held", "before") == 1, lost
    finally:
        third.stop()
    assert "exited prematurely" not in first.output() + third.output()


@pytest.mark.store
def test_an_answer_within_the_park_window_needs_no_second_run(client: HttpClient, parking_worker: Process) -> None:
    run = uuid.uuid4().hex[:8]
    task_id = start(client, "park_late", marker=run)
    wait_status(client, task_id, {"input_required"})
    answer(client, task_id, approve=True)
    task = wait_status(client, task_id, {"completed", "failed", "cancelled"})
    assert task["status"] == "completed" and task["result"]["content"][0]["text"] == f"build-1 {run} approve=True"
    assert counted(run, "before") == 1  # one run: the step outside ctx.once did not run again


@pytest.mark.broker
@pytest.mark.store
def test_a_cancelled_parked_job_ends_at_once_and_never_runs_again(client: HttpClient, parking_worker: Process) -> None:
    """At once: the first `tasks/get` after `tasks/cancel` answered reads it cancelled, by the cancel itself
    (a running job would read `working` until it stopped or the grace ran out). How soon, in time, is a
    goal of the benchmark, not of this test."""
    run = uuid.uuid4().hex[:8]
    task_id = start(client, "park_at_once", marker=run, work_s=0)
    wait_for(lambda: asking_parked(client, task_id), 20, 0.05, "the job to park")
    asked = client.get(task_id)
    client.result("tasks/cancel", {"taskId": task_id})
    task = client.get(task_id)
    assert task["status"] == "cancelled" and task["statusMessage"] == CANCELLED_WHILE_PARKED, task
    # A late answer is not taken, and a job queued after it runs while it does not.
    reply = client.result(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {key_of(asked): {"action": "accept", "content": {"approve": True}}}},
        capabilities=ELICIT,
    )
    assert reply["resultType"] == "complete"
    after = start(client, "no_question", text="after")
    assert wait_status(client, after, {"completed", "failed", "cancelled"})["status"] == "completed"
    assert counted(run, "before") == 1 and client.get(task_id)["status"] == "cancelled"
    assert not indexed(task_id)  # top and the metrics count it no more
    # Celery's own view (and Flower's, from the event), shown by the server in the background.
    wait_for(lambda: AsyncResult(task_id, app=parking_jobs.app).state == "REVOKED", 10, 0.05, "Celery's REVOKED")


@pytest.mark.store
def test_a_parked_question_that_times_out_ends_the_task_failed_naming_the_setting(
    client: HttpClient, parking_worker: Process
) -> None:
    task_id = start(client, "park_at_once", marker=uuid.uuid4().hex[:8], work_s=0, timeout=2)
    wait_for(lambda: asking_parked(client, task_id), 20, 0.05, "the job to park")
    task = wait_status(client, task_id, {"cancelled", "completed", "failed"}, timeout=30)
    assert task["status"] == "failed" and "MCP_CELERY_INPUT_TIMEOUT_S" in task["statusMessage"], task
    assert not indexed(task_id)


@pytest.mark.store
def test_a_job_with_two_questions_parks_at_each_and_ends_with_both_answers(
    client: HttpClient, parking_worker: Process
) -> None:
    """Its questions sit in a handler that catches everything but `mcp_celery.JobSignal`: each park passes it."""
    run = uuid.uuid4().hex[:8]
    task_id = start(client, "two_questions", marker=run)
    for approve in (True, False):
        wait_for(lambda: asking_parked(client, task_id), 20, 0.05, "the job to park")
        answer(client, task_id, approve=approve)
    task = wait_status(client, task_id, {"completed", "failed", "cancelled"})
    assert task["status"] == "completed" and task["result"]["content"][0]["text"] == "True False", task
    assert counted(run, "before") == 3  # the first run, then one resume per question


def test_a_parked_task_survives_a_server_restart_and_a_redis_restart_with_aof(
    parking_env: dict[str, str], own_redis: PersistentRedis, tmp_path: Path
) -> None:
    own = {**parking_env, "PARKING_BROKER_URL": f"{own_redis.url}/0", "PARKING_BACKEND_URL": f"{own_redis.url}/1"}
    own["MCP_CELERY_REDIS_URL"] = own["PARKING_BACKEND_URL"]  # the store on the Redis that restarts, in every pass
    log = tmp_path / "worker.log"
    worker = start_worker(own, log, app=APP, name=f"aof-{own_redis.port}", concurrency=1, queues=parking_jobs.QUEUE)
    url, server = start_http_server(own, tmp_path / "server-1.log", app=APP)
    marks = redis.Redis.from_url(f"{own_redis.url}/1")
    client = HttpClient(url)
    try:
        task_id = start(client, "park_at_once", marker="aof", work_s=0)
        key = parking_jobs.keys.task(task_id)
        wait_for(lambda: client.get(task_id)["status"] == "input_required" and marks.hexists(key, "parked"), 20)
        client.close()
        server.stop()
        marks.close()
        own_redis.stop()  # SIGTERM: Redis writes its append-only file
        own_redis.start()
        url, server = start_http_server(own, tmp_path / "server-2.log", app=APP)
        client = HttpClient(url)
        assert client.get(task_id)["status"] == "input_required"
        answer(client, task_id, approve=True)
        task = wait_status(client, task_id, {"completed", "failed", "cancelled"}, timeout=60)
        assert task["status"] == "completed" and task["result"]["content"][0]["text"] == "build-1 aof approve=True"
    finally:
        client.close()
        server.stop()
        worker.stop()


@REDIS_BROKER_ONLY
@pytest.mark.store
def test_an_at_least_once_job_that_parks_leaves_no_unacked_message_and_resumes_once(
    client: HttpClient, parking_worker: Process
) -> None:
    """Late ack: the park acknowledges the message (else kombu would deliver it again after the visibility
    timeout), and the runs counter of `retry_on_worker_loss` counts the park and its resume as one run."""
    broker = redis.Redis.from_url(parking_jobs.BROKER)
    try:
        run = uuid.uuid4().hex[:8]
        task_id = start(client, "park_at_least_once", marker=run)
        wait_for(lambda: asking_parked(client, task_id), 20, 0.05, "the job to park")
        wait_for(lambda: broker.hlen("unacked") == 0, 10, 0.05, "the parked job's message to be acknowledged")
        answer(client, task_id, approve=True)
        task = wait_status(client, task_id, {"completed", "failed", "cancelled"})
        assert task["status"] == "completed" and task["result"]["content"][0]["text"] == f"build-1 {run} approve=True"
        assert int(parking_jobs.records.hget(parking_jobs.keys.task(task_id), FIELD.RUNS) or 0) == 1
        # Late ack: the worker acknowledges the resumed message after the job returned, so after the record
        # says completed (seen once in CI: the status read first, the ack a moment later).
        wait_for(lambda: broker.hlen("unacked") == 0, 10, 0.05, "the resumed job's message to be acknowledged")
    finally:
        broker.close()


@REDIS_BROKER_ONLY
@pytest.mark.store
def test_an_answer_whose_resumed_message_was_never_sent_is_sent_again_by_the_reaper(
    client: HttpClient, parking_worker: Process
) -> None:
    """A server that dies between the answer (ANSWER unparked the task) and sending the resumed message:
    done here by hand, as that server would have, through the store alone. The reaper finds no message
    and sends it again, instead of ending the task failed or waiting for the question's timeout."""
    run = uuid.uuid4().hex[:8]
    task_id = start(client, "park_at_once", marker=run, work_s=0)
    wait_for(lambda: asking_parked(client, task_id), 20, 0.05, "the job to park")
    answers = {key_of(client.get(task_id)): json.dumps({"action": "accept", "content": {"approve": True}})}
    resume = asyncio.run(answer_without_resuming(task_id, answers))
    assert resume is not None  # the answer unparked it: the dead server would have sent this
    task = wait_status(client, task_id, {"completed", "failed", "cancelled"}, timeout=60)
    assert task["status"] == "completed" and task["result"]["content"][0]["text"] == f"build-1 {run} approve=True", task


async def answer_without_resuming(task_id: str, answers: dict[str, str]) -> str | None:
    """What the task service does with an answer to a parked task, short of sending the resumed message."""
    client = async_client(redis_target(parking_jobs.STORE))
    try:
        store = AsyncStore(client, parking_jobs.keys, Lifetimes(86400, 3600))
        await store.recheck([task_id], now_ms() + 3000)  # MCP_CELERY_QUEUE_CHECK_S of the tests' servers
        taken, resume = await store.answer(task_id, answers, now_ms())
        assert taken == list(answers)
        return resume
    finally:
        await client.aclose()


@pytest.mark.store
def test_a_cancel_read_before_the_job_parked_still_cancels_it_as_parked_and_shows_celerys_revoked(
    client: HttpClient, parking_env: dict[str, str], tmp_path: Path
) -> None:
    """The race under load, staged: `tasks/cancel` reads the task (`found`) while its job has not parked
    yet, and the cancel lands once it has. The store's CANCEL script, atomic with PARK, decides from the
    record as it is then, not from the read: cancelled as parked, and Celery's backend shows REVOKED,
    which only the server writes for a parked job (no worker runs it to say so)."""
    run = uuid.uuid4().hex[:8]
    task_id = start(client, "park_at_once", marker=run, work_s=0)  # no worker yet: it cannot have parked
    settings = Settings(redis_url=parking_jobs.STORE, key_prefix=parking_jobs.PREFIX)
    service = TaskService(AppBinding.create(parking_jobs.app, settings))
    worker: list[Process] = []

    def park() -> None:
        worker.append(one_worker(parking_env, tmp_path / "worker.log"))
        wait_for(lambda: asking_parked(client, task_id), 30, 0.05, "the job to park")

    try:
        asyncio.run(cancel_after(service, task_id, park))
        task = client.get(task_id)
        assert task["status"] == "cancelled" and task["statusMessage"] == CANCELLED_WHILE_PARKED, task
        assert AsyncResult(task_id, app=parking_jobs.app).state == "REVOKED"
        assert not parking_jobs.records.zscore(parking_jobs.keys.live(), task_id)  # nothing left to watch
        assert not indexed(task_id)
        after = start(client, "no_question", text="after")  # queued behind it: it runs, the cancelled job not
        assert wait_status(client, after, {"completed", "failed", "cancelled"})["status"] == "completed"
        assert counted(run, "before") == 1
    finally:
        for proc in worker:
            proc.stop()


async def cancel_after(service: TaskService, task_id: str, park: Callable[[], None]) -> None:
    """`tasks/cancel`'s call of the service with a read it made before `park()` parked the job."""
    try:
        found = await service.read_view(task_id)
        assert found is not None and found[0].parked_until_ms is None and not found[1].terminal, found
        await asyncio.to_thread(park)
        await service.cancel_task(found)
    finally:
        await service.store.aclose()
