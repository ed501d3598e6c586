"""SEP-2663 wire models as the client reads and sends them (tier 0: pydantic and mcp_types only).

Every model subclasses an `mcp_types` base, so field names come out camelCase through the SDK's alias
generator. The `tasks/*` requests set `name_param = "taskId"`: the SDK mirrors it into the `Mcp-Name`
header that the extension requires on Streamable HTTP.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from mcp_types import (
    CallToolResult,
    ErrorData,
    NotificationParams,
    Request,
    RequestParams,
    Result,
    SubscriptionFilter,
    SubscriptionsListenRequest,
    SubscriptionsListenRequestParams,
)
from pydantic import ConfigDict

from mcp_celery.protocol import TASKS_EXTENSION, TERMINAL_STATUSES, TaskStatus

__all__ = [
    "Ack",
    "TASKS_EXTENSION_ID",
    "TERMINAL_STATUSES",
    "CancelTaskRequest",
    "CreateTaskResult",
    "DetailedTask",
    "GetTaskRequest",
    "TaskIdParams",
    "TaskNotificationParams",
    "TaskStatus",
    "UpdateTaskParams",
    "UpdateTaskRequest",
    "listen_request",
]

#: One copy of each, in the wire vocabulary shared with the server (tier 0: no celery, no redis).
TASKS_EXTENSION_ID: Final = TASKS_EXTENSION


class _TaskFields(Result):
    """The `Task` object shared by CreateTaskResult, tasks/get and notifications/tasks."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreateTaskResult(_TaskFields):
    """`tools/call` answered with a task handle (`resultType: "task"`, flat)."""

    result_type: Literal["task"] = "task"  # the SDK's ResultClaim needs the Literal pin


class DetailedTask(_TaskFields):
    """`tasks/get` result: the task plus `inputRequests`, `result` or `error` depending on the status.

    `inputRequests` stays raw JSON here: one request of a shape this client does not know must not make
    the whole task unreadable; the handle parses each request on its own.
    """

    result_type: str = "complete"
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: ErrorData | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def call_tool_result(self) -> CallToolResult | None:
        """The inlined `CallToolResult` of a completed task, else None."""
        return CallToolResult.model_validate(self.result) if self.result is not None else None


class TaskNotificationParams(NotificationParams):
    """`notifications/tasks` params: a complete DetailedTask, as `tasks/get` would return it then."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: TaskStatus

    def detailed(self) -> DetailedTask:
        return DetailedTask.model_validate(self.model_dump(by_alias=True, exclude={"meta"}))


class Ack(Result):
    """The empty acknowledgement of `tasks/update`, `tasks/cancel` and a finished `subscriptions/listen`."""

    model_config = ConfigDict(extra="allow")


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTaskRequest(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


def listen_request(task_ids: list[str]) -> SubscriptionsListenRequest:
    """`subscriptions/listen` asking for `notifications/tasks` about `task_ids` (the extension's filter field)."""
    notifications = SubscriptionFilter.model_validate({"taskIds": task_ids})
    return SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(notifications=notifications))
