"""Workflows: a Celery group, chord or chain as one MCP task, across the session's prefork worker processes.

The sample tools (`sweep`, `steps`, `fanout` in tests/support/sample_jobs.py) hand their task over to a canvas
of ordinary Celery tasks (`wf_member`, a merge step) with `ctx.run_workflow`; the members run on any
worker process, each with a record of its own naming the MCP task.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from mcp_celery.core.status import TaskView
from mcp_celery.core.workflows import Member, Workflow, aggregate
from mcp_celery.protocol import TERMINAL_STATUSES
from mcp_celery.server.engine.reaper import LOST_BEFORE_START
from mcp_celery.store.schema import FIELD, Keys, TaskRecord
from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, caps, start_worker, wait_for
from tests.support.push import listen, notifications_until_end

REDIS_BROKER = os.environ["TEST_BROKER_URL"].startswith("redis")


def workflow_of(store_redis: redis.Redis, task_id: str) -> Workflow:
    raw = wait_for(lambda: store_redis.hget(Keys().task(task_id), FIELD.WORKFLOW), 30, what="the workflow to start")
    return Workflow.from_json(raw.decode())


def terminal(task: dict[str, Any]) -> dict[str, Any] | None:
    return task if task["status"] in TERMINAL_STATUSES else None


def celery_meta(task_id: str) -> dict[str, Any]:
    return dict(sample_jobs.app.backend.get_task_meta(task_id, cache=False))


@pytest.mark.broker
@pytest.mark.store
def test_a_group_and_its_merge_step_run_as_one_task_whose_result_is_the_merge_steps(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    marker = f"sweep-{uuid.uuid4()}"
    task_id = client.start("sweep", {"n": 4, "seconds": 1.0, "marker": marker})
    stream, _ = listen(client, [task_id])
    try:
        seen, _ = notifications_until_end(stream, timeout=60)
    finally:
        stream.close()
    done = seen[-1]
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"sum": 0 + 1 + 4 + 9, "failed": []}
    messages = [t.get("statusMessage", "") for t in seen]
    # The members' progress, with a running member's own words (its `ctx.status`) under its label.
    pattern = re.compile(r"\d/4 done, [1-4] running; wf_member-(\d): member (\d): step \d+")
    matched = [found for found in (pattern.fullmatch(m) for m in messages) if found is not None]
    assert matched, messages
    assert all(int(found[1]) == int(found[2]) + 1 for found in matched), messages
    workflow = workflow_of(store_redis, task_id)
    assert [m.label for m in workflow.members] == ["wf_member-1", "wf_member-2", "wf_member-3", "wf_member-4"]
    # Every member ran once, and Celery knows the MCP task's Celery task as their parent (Flower shows them so).
    assert sorted(int(k) for k in store_redis.hgetall(marker)) == [0, 1, 2, 3]
    for member in workflow.everyone:
        assert celery_meta(member.id).get("parent_id") == task_id, member
        # Its keys are in the MCP task's slot: the scripts that change it announce on the task's channel.
        assert key_slot(Keys().task(member.id).encode()) == key_slot(Keys().events(task_id).encode()), member
    assert client.get(task_id)["status"] == "completed"


@pytest.mark.broker
@pytest.mark.store
def test_the_first_failing_member_fails_the_workflow_and_the_others_are_cancelled(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    task_id = client.start("sweep", {"n": 4, "seconds": 30.0, "fail_at": 1})  # member 1 fails at once
    failed = client.wait(task_id, timeout=60)
    assert failed["status"] == "failed", failed
    assert "member wf_member-2" in failed["error"]["message"] and "failed on purpose" in failed["error"]["message"]
    workflow = workflow_of(store_redis, task_id)
    others = [m for m in workflow.members if m.label != "wf_member-2"]
    # Stopped at their next checkpoint (or never started), long before their 30 s were up.
    ends = {m.label: wait_for(lambda m=m: terminal(client.get(m.id)), 20, what=f"{m.label} to end") for m in others}
    assert {label: end["status"] for label, end in ends.items()} == {m.label: "cancelled" for m in others}, ends
    assert workflow.merge is not None and client.get(workflow.merge.id)["status"] == "cancelled"  # never launched


def test_the_failure_names_the_member_that_failed_even_once_a_member_before_it_was_cancelled_for_it() -> None:
    # What a reader sees while the other members' cancels are going out (CI's RabbitMQ pass once froze
    # "member wf_member-1 failed: cancelled by client" here): the member that failed is the one named.
    members = tuple(Member(f"id-{i}", f"wf_member-{i + 1}", "tests.support.sample_jobs.wf_member") for i in range(3))
    workflow = Workflow("group", members)
    parent = TaskRecord(task_id="parent", tool="sweep", created_ms=1000, ttl_ms=None, poll_ms=500)
    views = {
        "id-0": TaskView("cancelled", 1300, "cancelled by client"),
        "id-1": TaskView("failed", 1200, "member 1 failed on purpose", error={"code": -32603, "message": "boom"}),
        "id-2": TaskView("working", 1100, "running"),
    }
    found = {task_id: (TaskRecord(task_id=task_id, tool="wf_member", created_ms=1000, ttl_ms=None, poll_ms=500), view)
             for task_id, view in views.items()}  # fmt: skip
    step = aggregate(workflow, parent, found, 1400, tool=None)
    assert step.view.status == "failed" and step.freeze
    assert step.view.status_message == "member wf_member-2 (tests.support.sample_jobs.wf_member) failed: boom"
    assert step.cancel == ("id-2",)
    # With no member failed on its own, the first one cancelled is named, as before.
    only_cancelled = {**found, "id-1": (found["id-1"][0], TaskView("working", 1200, "running"))}
    named = aggregate(workflow, parent, only_cancelled, 1400, tool=None).view.status_message
    assert named == "member wf_member-1 (tests.support.sample_jobs.wf_member) failed: cancelled by client"


@pytest.mark.broker
@pytest.mark.store
def test_with_the_partial_policy_the_merge_step_gets_the_survivors_and_says_which_failed(client: HttpClient) -> None:
    task_id = client.start("sweep", {"n": 4, "fail_at": 2, "policy": "partial"})
    done = client.wait(task_id, timeout=60)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"sum": 0 + 1 + 9, "failed": ["wf_member-3"]}


@pytest.mark.broker
@pytest.mark.store
def test_a_chain_ends_with_its_last_steps_result_and_a_group_without_merge_with_every_members(
    client: HttpClient,
) -> None:
    chained = client.wait(client.start("steps", {"n": 3}), timeout=60)
    assert chained["status"] == "completed" and chained["result"]["content"][0]["text"] == "4", chained
    fanned = client.wait(client.start("fanout", {"n": 3}), timeout=60)
    assert fanned["status"] == "completed", fanned
    assert fanned["result"]["content"][0]["text"] == '{"results": [0, 1, 4], "failed": []}'


@pytest.mark.store
def test_a_member_with_a_task_id_of_its_own_is_a_tool_error_saying_what_to_change(client: HttpClient) -> None:
    done = client.wait(client.start("fanout", {"n": 2, "own_ids": True}), timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"], done
    assert "leave task_id unset on tests.support.sample_jobs.wf_member" in done["result"]["content"][0]["text"], done


@pytest.mark.broker
@pytest.mark.store
def test_a_question_of_the_merge_step_shows_on_the_task_and_its_answer_reaches_the_step(client: HttpClient) -> None:
    task_id = client.start("sweep", {"n": 3, "asking": True}, elicitation={})
    waiting = client.wait(task_id, {"input_required", "completed", "failed", "cancelled"}, timeout=60)
    assert waiting["status"] == "input_required", waiting
    (key,) = waiting["inputRequests"]
    assert key == "merge/elicit-1" and waiting["inputRequests"][key]["params"]["message"] == "Keep the sum 5?"
    answer = {"action": "accept", "content": {"confirm": True}}
    client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}, capabilities=caps())
    done = client.wait(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["structuredContent"] == {"sum": 5, "failed": []}, done


@pytest.mark.broker
@pytest.mark.result_backend
@pytest.mark.store
def test_a_cancel_mid_sweep_starts_no_member_after_it_and_stops_the_running_ones(
    patient_client: HttpClient, store_redis: redis.Redis, patient_env: dict[str, str], tmp_path: Path
) -> None:
    """Four members, two slots (a worker of the test's own, so no other test's job holds a slot): two run,
    two wait; the cancel ends all. The server and the members' worker both judge the workflow with a
    grace no wait here reaches (conftest.PATIENT_GRACE_S), so `cancelled` comes from the members stopping."""
    client = patient_client
    name = f"wf-cancel-{uuid.uuid4().hex[:8]}"
    members = start_worker(patient_env, tmp_path / "wf-cancel.log", queues="wf", name=name, concurrency=2)
    marker = f"cancel-{uuid.uuid4()}"
    task_id = client.start("sweep", {"n": 4, "seconds": 60, "marker": marker, "queue": "wf"})
    try:
        wait_for(lambda: store_redis.hlen(marker) == 2, 30, what="two members to run")
        workflow = workflow_of(store_redis, task_id)
        client.result("tasks/cancel", {"taskId": task_id})
        cancelled = client.wait(task_id, timeout=30)  # members that ignored it would run on for 60 s
        # Ended by its members stopping at a checkpoint, not by a grace running out.
        assert cancelled["status"] == "cancelled" and cancelled["statusMessage"] == "cancelled", cancelled
        # Every member has ended: those that ran stopped (REVOKED), those that waited never start.
        wait_for(
            lambda: all(celery_meta(m.id)["status"] == "REVOKED" for m in workflow.members),
            30,
            what="every member to end REVOKED",
        )
        node = f"{name}@{os.uname().nodename}"
        wait_for(lambda: (sample_jobs.app.control.inspect(destination=[node]).active() or {}).get(node) == [], 15)
        # Both slots are free now: a waiting member that had not been stopped would have started by now.
        assert store_redis.hlen(marker) == 2
        merge = workflow.merge
        assert merge is not None and client.get(merge.id)["status"] == "cancelled"  # never launched
    finally:
        members.stop()


@pytest.mark.broker
@pytest.mark.store
def test_a_plain_client_follows_a_workflow_with_the_lifecycle_tools(client: HttpClient) -> None:
    reply = client.result("tools/call", {"name": "sweep", "arguments": {"n": 3, "seconds": 4}}, capabilities={})
    handle = reply["_meta"]["mcp-celery/task"]
    deadline = time.monotonic() + 60
    while True:
        status = client.result(
            "tools/call", {"name": "task_status", "arguments": {"task_id": handle["taskId"], "wait_seconds": 3}},
            capabilities={},
        )  # fmt: skip
        if status["structuredContent"]["status"] == "completed" or time.monotonic() > deadline:
            break
    assert status["structuredContent"]["status"] == "completed", status
    assert status["structuredContent"]["result"]["structuredContent"] == {"sum": 5, "failed": []}, status


@pytest.fixture
def members_worker(env: dict[str, str], worker: Process, tmp_path: Path) -> Iterator[Process]:
    """A worker of its own for the members' queue (`wf`), which the test kills."""
    proc = start_worker(env, tmp_path / "wf.log", queues="wf", name=f"wf-{uuid.uuid4().hex[:8]}", concurrency=2)
    yield proc
    proc.stop()


@pytest.mark.store
@pytest.mark.skipif(not REDIS_BROKER, reason="only a Redis broker's queues can be looked into")
@pytest.mark.parametrize(
    ("tool", "arguments", "who"), [("sweep", {"n": 2}, "merge"), ("steps", {"n": 2}, "wf_member-2")]
)
def test_a_message_sent_when_its_turn_came_and_lost_before_any_worker_took_it_fails_the_task(
    client: HttpClient, tool: str, arguments: dict[str, Any], who: str
) -> None:
    """A merge step and a chain's later step are sent once the members before them end, and watched from then."""
    broker = redis.Redis.from_url(os.environ["TEST_BROKER_URL"])
    nowhere = f"nowhere-{uuid.uuid4()}"  # a queue no worker consumes
    queue_option = "merge_queue" if tool == "sweep" else "last_queue"
    task_id = client.start(tool, {**arguments, queue_option: nowhere})
    wait_for(lambda: broker.llen(nowhere) == 1, 30, what=f"the message of {who} to be sent")
    assert broker.rpop(nowhere) is not None  # lost, as a broker restarted without persistence would lose it
    failed = client.wait(task_id, timeout=60)
    assert failed["status"] == "failed", failed
    assert who in failed["error"]["message"] and LOST_BEFORE_START in failed["error"]["message"], failed


@pytest.mark.broker
@pytest.mark.store
def test_a_members_worker_killed_fails_an_at_most_once_workflow_honestly(
    client: HttpClient, store_redis: redis.Redis, members_worker: Process
) -> None:
    marker = f"killed-{uuid.uuid4()}"
    task_id = client.start("sweep", {"n": 2, "seconds": 120, "marker": marker, "queue": "wf"})
    wait_for(lambda: store_redis.hlen(marker) == 2, 30, what="both members to run")
    os.killpg(members_worker.pid, signal.SIGKILL)  # the worker and its pool at once
    failed = client.wait(task_id, timeout=40)  # the heartbeat deadline (6 s) and a sweep or two
    assert failed["status"] == "failed", failed
    assert "worker running the job was lost" in failed["error"]["message"], failed


@pytest.mark.broker
@pytest.mark.store
def test_an_at_least_once_member_runs_again_on_another_worker_and_the_workflow_completes(
    client: HttpClient, store_redis: redis.Redis, members_worker: Process, env: dict[str, str], tmp_path: Path
) -> None:
    marker = f"again-{uuid.uuid4()}"
    task_id = client.start("sweep", {"n": 2, "seconds": 3, "marker": marker, "queue": "wf", "at_least_once": True})
    wait_for(lambda: store_redis.hlen(marker) == 2, 30, what="both members to run")
    os.killpg(members_worker.pid, signal.SIGKILL)
    again = start_worker(env, tmp_path / "wf-again.log", queues="wf", name=f"wf-again-{uuid.uuid4().hex[:8]}")
    try:
        done = client.wait(task_id, timeout=90)  # found lost, put back on the queue, run again
    finally:
        again.stop()
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"sum": 0 + 1, "failed": []}
    assert {k: int(v) for k, v in store_redis.hgetall(marker).items()} == {b"0": 2, b"1": 2}
