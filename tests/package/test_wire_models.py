"""One definition of the SEP-2663 shapes: the dicts the server builds on its hot paths are exactly what
the pydantic models of `mcp_celery.protocol` (the client's) read, and write back key for key.

The server builds `DetailedTask` and `CreateTaskResult` as dicts (`protocol.detailed_task`,
`protocol.create_task_result`): about twice as fast as a model and its dump, on every `tasks/get` and
`notifications/tasks`. These tests hold the builders to the models: no key the model does not define,
every key the model reads, and omitted-vs-null the same both ways.
"""

from __future__ import annotations

from typing import Any

import pytest

from mcp_celery import protocol
from mcp_celery.client import CreateTaskResult as ClientCreateTaskResult
from mcp_celery.client import DetailedTask as ClientDetailedTask
from mcp_celery.protocol import (
    CancelTaskRequest,
    CreateTaskResult,
    DetailedTask,
    GetTaskRequest,
    TaskIdParams,
    TaskNotificationParams,
    UpdateTaskParams,
    UpdateTaskRequest,
)
from mcp_celery.server import app

CREATED = 1_700_000_000_000
RESULT = protocol.call_tool_result({"answer": 42}, structured=True)
INPUTS = {"confirm": {"method": "elicitation/create", "params": {"message": "sure?", "requestedSchema": {}}}}
ERROR = {"code": protocol.INVALID_PARAMS, "message": "the job refused", "data": {"reason": "x"}}

CASES: list[dict[str, Any]] = [
    {"status": "working", "status_message": "queued"},
    {"status": "working", "status_message": None, "ttl_ms": None},
    {"status": "working", "status_message": ""},
    {"status": "input_required", "status_message": "asks", "input_requests": INPUTS},
    {"status": "input_required", "input_requests": None},
    {"status": "completed", "result": RESULT},
    {"status": "completed", "result": None},
    {"status": "failed", "error": ERROR},
    {"status": "failed", "error": {"code": -32603, "message": "no data"}},
    {"status": "failed", "error": None},
    {"status": "cancelled", "status_message": "cancelled by the client"},
]


def built(case: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"ttl_ms": 60_000, **case}
    return protocol.detailed_task(task_id="t-1", created_ms=CREATED, updated_ms=CREATED + 1500, poll_ms=1000, **kwargs)


def round_trip(model: Any, wire: dict[str, Any]) -> dict[str, Any]:
    parsed = model.model_validate(wire)
    assert not parsed.model_extra, f"keys the model does not define: {parsed.model_extra}"
    dumped: dict[str, Any] = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return dumped


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['status']}-{sorted(c)}")
def test_the_tasks_get_dict_is_the_detailed_task_model(case: dict[str, Any]) -> None:
    task = built(case)
    answer = {"resultType": "complete", **task}  # what tasks/get sends (server/tasks/handlers.py)
    assert round_trip(DetailedTask, answer) == answer
    parsed = DetailedTask.model_validate(answer)
    assert parsed.status == case["status"]
    assert parsed.terminal == (case["status"] in protocol.TERMINAL_STATUSES)
    assert "ttlMs" in task  # null when kept until deleted, never omitted
    assert ("statusMessage" in task) == bool(case.get("status_message"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['status']}-{sorted(c)}")
def test_a_notification_carries_the_same_detailed_task(case: dict[str, Any]) -> None:
    task = built(case)
    note = protocol.TaskStatusNotification(params={**task, "_meta": {"subscriptionId": 7}})
    wire = note.model_dump(by_alias=True, mode="json")
    assert wire == {"method": "notifications/tasks", "params": {**task, "_meta": {"subscriptionId": 7}}}
    params = TaskNotificationParams.model_validate(wire["params"])
    assert params.detailed() == DetailedTask.model_validate(task)


def test_the_create_task_result_dict_is_the_model() -> None:
    created = protocol.create_task_result(task_id="t-1", created_ms=CREATED, ttl_ms=None, poll_ms=500)
    assert round_trip(CreateTaskResult, created) == created
    assert created["resultType"] == "task" and created["statusMessage"] == protocol.QUEUED_MESSAGE
    assert created["ttlMs"] is None


def test_client_and_server_share_the_models() -> None:
    assert ClientDetailedTask is DetailedTask and ClientCreateTaskResult is CreateTaskResult
    # what the server registers as the params of tasks/get, tasks/update and tasks/cancel
    assert vars(app)["TaskIdParams"] is TaskIdParams and vars(app)["UpdateTaskParams"] is UpdateTaskParams


def test_the_requests_the_client_sends_are_the_params_the_server_reads() -> None:
    sent: list[GetTaskRequest | CancelTaskRequest | UpdateTaskRequest] = [
        GetTaskRequest(params=TaskIdParams(task_id="t-1")),
        CancelTaskRequest(params=TaskIdParams(task_id="t-1")),
        UpdateTaskRequest(params=UpdateTaskParams(task_id="t-1", input_responses={"confirm": {"action": "accept"}})),
    ]
    for request in sent:
        wire = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        assert wire["params"]["taskId"] == "t-1"
        reads = UpdateTaskParams if wire["method"] == "tasks/update" else TaskIdParams
        assert reads.model_validate(wire["params"]) == request.params
        assert type(request).name_param == "taskId"  # the SDK mirrors it into the Mcp-Name header
