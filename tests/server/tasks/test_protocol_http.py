"""SEP-2663 over Streamable HTTP against a real server, worker and Redis, in raw JSON-RPC.

Comments name the checklist items of shared/spec/tasks-extension.md §5.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
import redis

from mcp_celery.core.binding import AppBinding
from mcp_celery.protocol import TASKS_EXTENSION
from mcp_celery.settings import Settings
from mcp_celery.store.schema import FIELD, Keys
from mcp_celery.worker.config import WorkerBinding
from tests.support import sample_jobs
from tests.support.harness import HttpClient, caps, redis_commands_during, wait_for

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
MISSING_CAPABILITY = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}


def test_discover_advertises_the_extension_and_no_legacy_capability(client: HttpClient) -> None:  # item 1
    result = client.result("server/discover", capabilities={})
    assert result["capabilities"]["extensions"][TASKS_EXTENSION] == {}
    assert "tasks" not in result["capabilities"]


def test_tools_list_has_schemas_from_signatures_and_output_schema_from_models(client: HttpClient) -> None:
    tools = {t["name"]: t for t in client.result("tools/list")["tools"]}
    echo = tools["echo"]
    assert echo["description"] == "Repeat the text."
    assert echo["inputSchema"]["required"] == ["text"]
    assert set(echo["inputSchema"]["properties"]) == {"text", "times"}
    assert "outputSchema" not in echo
    assert tools["greeting"]["outputSchema"]["properties"]["length"]["type"] == "integer"
    assert "ctx" not in tools["checkpoint_loop"]["inputSchema"]["properties"]
    assert set(tools["legacy_progress"]["inputSchema"]["properties"]) == {"steps"}


@pytest.mark.broker
@pytest.mark.store
def test_declaring_call_returns_a_flat_create_task_result_readable_at_once(client: HttpClient) -> None:  # 9-12
    result = client.result("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert result["resultType"] == "task"
    assert result["status"] == "working"
    assert RFC3339.match(result["createdAt"]) and RFC3339.match(result["lastUpdatedAt"])
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 3_600_000
    assert isinstance(result["pollIntervalMs"], int) and result["pollIntervalMs"] > 0
    assert not {"task", "result", "error", "inputRequests", "requestState", "ttl", "pollInterval"} & set(result)
    assert len(result["taskId"]) >= 32  # item 13: 192 random bits
    got = client.get(result["taskId"])  # no delay: durable create
    assert got["resultType"] == "complete" and got["taskId"] == result["taskId"]


@pytest.mark.broker
@pytest.mark.result_backend
@pytest.mark.store
def test_the_record_exists_before_the_job_is_queued_and_celery_s_backend_is_not_needed(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    # `queued_elsewhere` goes to a queue no worker consumes: only what create wrote is there.
    task_id = client.start("queued_elsewhere", {"marker": f"m-{uuid.uuid4()}"})
    assert sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"] == "PENDING"  # nothing stored
    assert store_redis.hget(Keys().task(task_id), "tool") == b"queued_elsewhere"
    got = client.get(task_id)  # unknown and queued both read PENDING in Celery; ours knows
    assert got["status"] == "working" and got["statusMessage"] == "queued"
    client.result("tasks/cancel", {"taskId": task_id})


@pytest.mark.broker
@pytest.mark.result_backend
@pytest.mark.store
def test_completed_task_inlines_the_call_tool_result(client: HttpClient) -> None:  # 15, 17
    task = client.wait(client.start("echo", {"text": "hi", "times": 2}))
    assert task["status"] == "completed"
    assert task["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": "hi hi"}],
        "isError": False,
    }
    assert "_meta" not in task["result"]  # item 19


def test_structured_return_gives_structured_content(client: HttpClient) -> None:
    task = client.wait(client.start("greeting", {"name": "Ada"}))
    assert task["result"]["structuredContent"] == {"text": "Hello, Ada!", "length": 11}


@pytest.mark.broker
@pytest.mark.result_backend
def test_existing_celery_task_runs_unchanged_and_reports_celery_style_progress(client: HttpClient) -> None:
    task_id = client.start("legacy_progress", {"steps": 15})
    seen = client.wait(task_id, {"working"}, 10)
    deadline = time.monotonic() + 10
    while "/15" not in (seen.get("statusMessage") or "") and time.monotonic() < deadline:
        seen = client.get(task_id)
    assert re.match(r"\d+/15", seen["statusMessage"]), seen
    assert client.wait(task_id)["result"]["content"][0]["text"] == "15"
    assert sample_jobs.add.delay(2, 3).get(timeout=10) == 5  # plain Celery callers are unaffected


@pytest.mark.result_backend
def test_a_raising_job_is_completed_with_is_error_and_a_useful_message(client: HttpClient) -> None:  # 17
    task = client.wait(client.start("boom", {"message": "disk full"}))
    assert task["status"] == "completed" and task["result"]["isError"] is True
    text = task["result"]["content"][0]["text"]
    assert "ValueError" in text and "disk full" in text and "Traceback" not in text


@pytest.mark.result_backend
def test_protocol_error_is_failed_with_that_error_and_no_result(client: HttpClient) -> None:  # 17
    task = client.wait(client.start("protocol_fail"))
    assert task["status"] == "failed"
    assert task["error"] == {"code": -32602, "message": "bad thing", "data": {"why": "testing"}}
    assert "result" not in task and task["statusMessage"]


@pytest.mark.result_backend
def test_a_time_limit_is_failed_internal_error(client: HttpClient) -> None:
    task = client.wait(client.start("too_slow"), timeout=30)
    assert task["status"] == "failed" and task["error"]["code"] == -32603
    assert "time limit" in task["statusMessage"]


@pytest.mark.result_backend
def test_a_soft_time_limit_lets_the_job_clean_up_and_ends_failed(client: HttpClient, store_redis: redis.Redis) -> None:
    m = f"soft-{uuid.uuid4()}"
    task = client.wait(client.start("cleans_up", {"marker": m}), timeout=30)
    assert task["status"] == "failed" and task["error"]["code"] == -32603
    assert "soft time limit" in task["statusMessage"]
    assert store_redis.get(m) == b"cleaned up"


@pytest.mark.broker
@pytest.mark.result_backend
def test_a_lost_worker_process_is_failed_internal_error(client: HttpClient) -> None:
    task = client.wait(client.start("die"), timeout=30)
    assert task["status"] == "failed" and task["error"]["code"] == -32603
    assert "worker" in task["statusMessage"].lower()


@pytest.mark.result_backend
@pytest.mark.store
def test_terminal_states_never_change(client: HttpClient, store_redis: redis.Redis) -> None:  # 34
    task_id = client.start("protocol_fail")
    first = client.wait(task_id)
    # Late writers (a redelivered copy, say): Celery's meta overwritten with SUCCESS, and the job's
    # own end stored again through the worker's store.
    sample_jobs.app.backend.store_result(task_id, "late", "SUCCESS")
    binding = AppBinding.create(sample_jobs.app, Settings(redis_url=sample_jobs.STORE))
    late = {"status": "SUCCESS", "result": "late", "traceback": None, "date_done": None}
    WorkerBinding(binding).store.job_ended(task_id, asked=False, outcome=late)
    again = client.get(task_id)
    assert again["status"] == "failed" and again["error"] == first["error"]


@pytest.mark.broker
def test_non_declaring_call_runs_synchronously(client: HttpClient) -> None:  # 3
    reply = client.result("tools/call", {"name": "echo", "arguments": {"text": "sync"}}, capabilities={})
    assert reply["resultType"] == "complete" and "taskId" not in reply
    assert reply["content"] == [{"type": "text", "text": "sync"}]


def test_declaration_is_read_per_request_never_inferred(client: HttpClient) -> None:  # 2
    assert client.result("tools/call", {"name": "echo", "arguments": {"text": "a"}})["resultType"] == "task"
    after = client.result("tools/call", {"name": "echo", "arguments": {"text": "b"}}, capabilities={})
    assert after["resultType"] == "complete"


def test_legacy_task_param_never_makes_a_task(client: HttpClient) -> None:  # 7
    params = {"name": "echo", "arguments": {"text": "x"}, "task": {"ttl": 60000}}
    reply = client.result("tools/call", params, capabilities={})
    assert reply["resultType"] == "complete" and "taskId" not in reply and "task" not in reply


def test_forbidden_tool_is_synchronous_even_for_declaring_clients(client: HttpClient) -> None:
    reply = client.result("tools/call", {"name": "sync_only", "arguments": {"text": "abc"}})
    assert reply["resultType"] == "complete" and reply["content"][0]["text"] == "ABC"


def test_required_tool_refuses_non_declaring_clients_with_32021(client: HttpClient) -> None:  # 4
    response = client.post("tools/call", {"name": "required_job", "arguments": {"text": "x"}}, capabilities={})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32021 and error["data"] == MISSING_CAPABILITY


def test_synchronous_failures_map_like_tasks(client: HttpClient) -> None:
    tool_error = client.result("tools/call", {"name": "boom", "arguments": {}}, capabilities={})
    assert tool_error["isError"] is True and "kaboom" in tool_error["content"][0]["text"]
    protocol = client.call("tools/call", {"name": "protocol_fail", "arguments": {}}, capabilities={})
    assert protocol["error"]["code"] == -32602


def test_invalid_arguments_get_the_sdk_tool_error_and_queue_nothing(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    before = len(list(store_redis.scan_iter("mcp-celery:task:*")))
    reply = client.result("tools/call", {"name": "echo", "arguments": {"times": "many"}})
    assert reply["resultType"] == "complete" and reply["isError"] is True
    assert reply["content"][0]["text"].startswith("Error executing tool echo:")
    extra = client.result("tools/call", {"name": "echo", "arguments": {"text": "x", "bogus": 1}})
    assert extra["isError"] is True
    assert len(list(store_redis.scan_iter("mcp-celery:task:*"))) == before


def test_unknown_tool_is_invalid_params(client: HttpClient) -> None:
    assert client.call("tools/call", {"name": "nope", "arguments": {}})["error"]["code"] == -32602


def test_tasks_methods_check_the_declaration_before_the_id(client: HttpClient) -> None:  # 5
    for method, extra in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
        error = client.call(method, {"taskId": "gate-test", **extra}, capabilities={})["error"]
        assert error["code"] == -32021 and error["data"] == MISSING_CAPABILITY, method


@pytest.mark.store
def test_unknown_task_ids_are_invalid_params(client: HttpClient) -> None:  # 18, 22, 27
    for method, extra in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
        response = client.post(method, {"taskId": "no-such-task", **extra})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == -32602, method


def test_removed_methods_are_method_not_found(client: HttpClient) -> None:  # 33
    for method in ("tasks/result", "tasks/list"):
        response = client.post(method, {"taskId": "x"} if method == "tasks/result" else {})
        assert response.status_code == 404 and response.json()["error"]["code"] == -32601


@pytest.mark.store
def test_mcp_name_must_match_the_task_id_when_present(client: HttpClient) -> None:  # 32
    task_id = client.start("echo", {"text": "x"})
    wrong = client.post("tasks/get", {"taskId": task_id}, name="someone-else")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == -32020
    missing = client.post("tasks/get", {"taskId": task_id}, name="")
    assert "result" in missing.json()


@pytest.mark.store
def test_a_finished_task_expires_after_its_ttl(client: HttpClient, store_redis: redis.Redis) -> None:  # 18, 20
    task_id = client.start("echo", {"text": "x"})
    assert client.wait(task_id)["status"] == "completed"
    time.sleep(0.5)  # the conformance suite's check: still readable just after terminal
    assert client.get(task_id)["status"] == "completed"
    # Move the task's end into the past, beyond its TTL; the record has not been evicted yet.
    key = Keys().task(task_id)
    outcome = json.loads(store_redis.hget(key, "outcome") or "{}")
    outcome["date_done"] = "2000-01-01T00:00:00+00:00"
    store_redis.hset(key, "outcome", json.dumps(outcome))
    assert client.call("tasks/get", {"taskId": task_id})["error"]["code"] == -32602


@pytest.mark.store
@pytest.mark.single_redis
def test_tasks_get_costs_one_redis_command(client: HttpClient) -> None:
    """MONITOR sees every command that touches the task: per tasks/get, one HGETALL."""
    task_id = client.wait(client.start("echo", {"text": "x"}))["taskId"]
    client.get(task_id)  # any first-terminal work is done by now
    names = redis_commands_during(sample_jobs.BACKEND, [task_id], lambda: [client.get(task_id) for _ in range(10)])
    assert names == ["HGETALL"] * 10, names


@pytest.mark.result_backend
@pytest.mark.store
def test_a_synchronous_call_that_outlasts_the_sync_timeout_is_cancelled_with_a_tool_error(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    """A `task_mode="forbidden"` tool never becomes a task, so a job past the sync timeout is cancelled.

    (Optional tools answer plain clients with a task handle instead: tests/server/plain/test_plain_hosts.py.)
    """
    # The test server's sync timeout is 5 s (MCP_CELERY_SYNC_TIMEOUT_S in conftest).
    for capabilities in ({}, caps()):  # forbidden: synchronous whether or not the request declares tasks
        m = f"sync-{uuid.uuid4()}"
        reply = client.result(
            "tools/call",
            {"name": "forbidden_loop", "arguments": {"seconds": 30, "marker": m}},
            capabilities=capabilities,
        )
        assert (
            reply["isError"] is True and "no result within 5 s, so the job was cancelled" in reply["content"][0]["text"]
        )
        task_id = store_redis.get(m).decode()  # the job noted its task id as it started
        assert store_redis.hexists(Keys().task(task_id), FIELD.CANCEL), "the call did not cancel the job"
        wait_for(
            lambda: sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"] == "REVOKED",  # noqa: B023
            15,
            what="the job to stop at its next checkpoint",
        )


@pytest.mark.store
def test_a_running_tasks_record_lives_ttl_plus_its_tools_own_time_limit(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    m = f"patient-{uuid.uuid4()}"
    task_id = client.start("patient", {"marker": m})
    wait_for(lambda: store_redis.get(m), 15, what="the job to start")
    ttl = store_redis.ttl(Keys().task(task_id))
    assert ttl > 86_400 + 9 * 86_400, ttl  # the app's limit is 6 h; this tool's is 10 days
    client.result("tasks/cancel", {"taskId": task_id})
    assert client.wait(task_id)["status"] == "cancelled"
