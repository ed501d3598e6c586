"""SEP-2663 wire vocabulary, its pydantic models, and every builder of a wire shape.

Tier 0: imports only the standard library, pydantic and `mcp_types` (never `mcp`, which loads the
SDK's server and client). Whatever reaches the wire as a task, a tool result or a -32021 payload is
defined here, so the flat `CreateTaskResult`, the per-status `DetailedTask`, the `CallToolResult`
of a job and the raw request envelope of the 2026-07-28 revision are each written once.

The models (`Task`, `CreateTaskResult`, `DetailedTask`, `TaskNotificationParams`, the `tasks/*`
params and requests) are the one definition of the extension's shapes: the client reads and sends
them, the server parses `tasks/*` params with them. The server's hot paths (`tasks/get`, every
`notifications/tasks`) build the same shapes as plain dicts with `detailed_task` and
`create_task_result`, about twice as fast as a model and its dump; tests/package/test_wire_models.py
checks that what they build is exactly what the models read and write back.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import quote, unquote

from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolResult,
    ErrorData,
    Notification,
    NotificationParams,
    Request,
    RequestParams,
    Result,
    SubscriptionFilter,
    SubscriptionsListenRequest,
    SubscriptionsListenRequestParams,
)
from pydantic import ConfigDict

__all__ = [
    "ARTIFACT_URI_PREFIX",
    "OUTPUT_DROPPED_LINE",
    "CAPABILITY_FOR_METHOD",
    "CLIENT_CAPABILITIES_META",
    "CLIENT_INFO_META",
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "MISSING_CAPABILITY_MESSAGE",
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "MODERN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION_META",
    "TASKS_EXTENSION",
    "TASKS_NOTIFICATION",
    "TASK_HANDLE_META",
    "TASK_MODES",
    "TASK_NOT_FOUND_MESSAGE",
    "TERMINAL_STATUSES",
    "TOOL_ERROR_PREFIX",
    "Ack",
    "CancelTaskRequest",
    "CreateTaskResult",
    "DetailedTask",
    "GetTaskRequest",
    "Task",
    "TaskIdParams",
    "TaskMode",
    "TaskNotificationParams",
    "TaskStatus",
    "TaskStatusNotification",
    "UpdateTaskParams",
    "UpdateTaskRequest",
    "artifact_uri",
    "output_dropped",
    "output_uri",
    "call_tool_result",
    "client_capabilities",
    "create_task_result",
    "detailed_task",
    "iso_ms",
    "listen_request",
    "missing_capability_data",
    "new_task_id",
    "now_ms",
    "request_body",
    "request_headers",
    "request_meta",
    "split_artifact_uri",
    "split_output_uri",
    "tool_error_result",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: The notification that carries a task's state to listeners.
TASKS_NOTIFICATION: Final = "notifications/tasks"
MODERN_PROTOCOL_VERSION = "2026-07-28"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"

MISSING_CAPABILITY_MESSAGE = "Missing required client capability"
#: Unknown, expired and foreign task ids all get this one text, so existence never leaks.
TASK_NOT_FOUND_MESSAGE = "Failed to retrieve task: Task not found"
#: The `statusMessage` of a task created and not started yet: what its creation answer says.
QUEUED_MESSAGE = "queued"
#: How every tool error text starts (the SDK's MCPServer words it the same way).
TOOL_ERROR_PREFIX = "Error executing tool"

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

#: How a tool runs: "optional" is a task when the request declares the extension, else
#: synchronous; "required" refuses non-declaring requests with -32021; "forbidden" is
#: always synchronous.
TaskMode = Literal["optional", "required", "forbidden"]
TASK_MODES: tuple[TaskMode, ...] = ("optional", "required", "forbidden")

#: Where a plain `CallToolResult` that answers with a running task carries its handle, for programs.
TASK_HANDLE_META = "mcp-celery/task"
#: The client capability each kind of input request needs.
CAPABILITY_FOR_METHOD = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}


# ---------------------------------------------------------------- the models of the extension's shapes
# Each subclasses an `mcp_types` base, so field names come out camelCase through the SDK's alias generator.


class Task(Result):
    """The `Task` object shared by CreateTaskResult, tasks/get and notifications/tasks.

    `ttlMs` is always present (null: kept until deleted); `statusMessage` only when there is one.
    """

    model_config = ConfigDict(extra="allow")

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreateTaskResult(Task):
    """`tools/call` answered with a task handle (`resultType: "task"`, flat); built by `create_task_result`."""

    result_type: Literal["task"] = "task"  # the SDK's ResultClaim needs the Literal pin


class DetailedTask(Task):
    """`tasks/get` result: the task plus `inputRequests`, `result` or `error` depending on the status.

    Built by `detailed_task`, which sets exactly the member the status requires. `inputRequests` stays
    raw JSON here: one request of a shape a client does not know must not make the whole task
    unreadable; the client's handle parses each request on its own.
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


class TaskStatusNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """`notifications/tasks` as the server sends it: params are a `detailed_task` dict (the fields of
    `TaskNotificationParams`) plus the subscription id in `_meta`."""

    method: Literal["notifications/tasks"] = TASKS_NOTIFICATION
    params: dict[str, Any]


class Ack(Result):
    """The empty acknowledgement of `tasks/update`, `tasks/cancel` and a finished `subscriptions/listen`."""

    model_config = ConfigDict(extra="allow")


class TaskIdParams(RequestParams):
    """The params of `tasks/get` and `tasks/cancel`."""

    task_id: str


class UpdateTaskParams(TaskIdParams):
    """The params of `tasks/update`."""

    # Values stay untyped: answers under keys that are not outstanding are ignored,
    # whatever they hold, so they must not fail validation here.
    model_config = ConfigDict(extra="allow")
    input_responses: dict[str, Any]


# The `tasks/*` requests set `name_param = "taskId"`: the SDK mirrors it into the `Mcp-Name` header
# that the extension requires on Streamable HTTP.


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


# ---------------------------------------------------------------- builders


def new_task_id() -> str:
    """192 random bits, URL-safe (the spec asks for at least 122): a task id can be neither guessed nor enumerated.

    Never starting with '-': `mcp-celery tasks wait -abc...` would read the id as an option.
    """
    while True:
        task_id = secrets.token_urlsafe(24)
        if not task_id.startswith("-"):
            return task_id


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds, the unit of every timestamp mcp-celery stores."""
    return int(time.time() * 1000)


def iso_ms(epoch_ms: int) -> str:
    """RFC 3339 timestamp with an explicit UTC offset, millisecond precision."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def missing_capability_data(capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `data` member of a -32021 error (the 2026-07-28 schema requires it); default: the tasks extension."""
    needed = {"extensions": {TASKS_EXTENSION: {}}} if capabilities is None else dict(capabilities)
    return {"requiredCapabilities": needed}


def call_tool_result(value: Any, *, structured: bool = False) -> dict[str, Any]:
    """A successful `CallToolResult` carrying `value` as text (and as structuredContent if `structured`).

    `resultType` is set inside the result too: the official TypeScript client rejects an
    inlined task result without it.
    """
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    result: dict[str, Any] = {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": False}
    if structured:
        result["structuredContent"] = value
    return result


def tool_error_result(tool: str, reason: str) -> dict[str, Any]:
    """A `CallToolResult` with `isError: true`: the tool ran (or could not) and says why."""
    text = f"{TOOL_ERROR_PREFIX} {tool}: {reason}"
    return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": True}


def detailed_task(
    *,
    task_id: str,
    status: TaskStatus,
    created_ms: int,
    updated_ms: int,
    ttl_ms: int | None,
    poll_ms: int,
    status_message: str | None = None,
    input_requests: Mapping[str, Any] | None = None,
    result: Mapping[str, Any] | None = None,
    error: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The wire `DetailedTask` (without `resultType`) for `tasks/get` and `notifications/tasks`.

    Exactly the member the status requires is present: `inputRequests` while input_required,
    `result` when completed, `error` when failed.
    """
    task: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": iso_ms(created_ms),
        "lastUpdatedAt": iso_ms(updated_ms),
        "ttlMs": ttl_ms,
        "pollIntervalMs": poll_ms,
    }
    if status_message:
        task["statusMessage"] = status_message
    if status == "input_required":
        task["inputRequests"] = dict(input_requests or {})
    elif status == "completed":
        task["result"] = None if result is None else dict(result)
    elif status == "failed":
        task["error"] = None if error is None else dict(error)
    return task


def create_task_result(
    *, task_id: str, created_ms: int, ttl_ms: int | None, poll_ms: int, status_message: str = QUEUED_MESSAGE
) -> dict[str, Any]:
    """The flat `CreateTaskResult` for a task just queued: `resultType: "task"` and the Task fields only."""
    task = detailed_task(
        task_id=task_id,
        status="working",
        created_ms=created_ms,
        updated_ms=created_ms,
        ttl_ms=ttl_ms,
        poll_ms=poll_ms,
        status_message=status_message,
    )
    return {"resultType": "task", **task}


def client_capabilities(declare: bool = True, **extra: Any) -> dict[str, Any]:
    """Per-request client capabilities: the tasks extension (unless `declare` is false) plus `extra`."""
    out: dict[str, Any] = dict(extra)
    if declare:
        out["extensions"] = {TASKS_EXTENSION: {}}
    return out


def request_body(
    request_id: int,
    method: str,
    params: Mapping[str, Any] | None,
    capabilities: Mapping[str, Any],
    client_name: str = "mcp-celery",
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A 2026-07-28 JSON-RPC request: the stateless `_meta` envelope travels in every request's params.

    `meta` adds to the envelope (e.g. a `progressToken`).
    """
    envelope = {**request_meta(capabilities, client_name), **(meta or {})}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": envelope}}


def request_meta(capabilities: Mapping[str, Any], client_name: str = "mcp-celery") -> dict[str, Any]:
    """The `_meta` envelope of a 2026-07-28 request: protocol version, client capabilities and info."""
    return {
        PROTOCOL_VERSION_META: MODERN_PROTOCOL_VERSION,
        CLIENT_CAPABILITIES_META: dict(capabilities),
        CLIENT_INFO_META: {"name": client_name, "version": "0"},
    }


def request_headers(method: str, name: str | None = None) -> dict[str, str]:
    """Streamable HTTP headers of a 2026-07-28 request; `name` is the Mcp-Name (tool name or task id)."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN_PROTOCOL_VERSION,
        "Mcp-Method": method,
    }
    if name:
        headers["Mcp-Name"] = name
    return headers


# ---------------------------------------------------------------- artifact resources

#: Every artifact URI starts so; then `{taskId}/artifacts/{name}` (`mcp_celery.store.artifacts`).
ARTIFACT_URI_PREFIX = "mcp-celery://tasks/"


def artifact_uri(task_id: str, name: str) -> str:
    """The resource URI of a task's artifact, both parts percent-encoded."""
    return f"{ARTIFACT_URI_PREFIX}{quote(task_id, safe='')}/artifacts/{quote(name, safe='')}"


def split_artifact_uri(uri: str) -> tuple[str, str] | None:
    """`(task id, name)` of a URI shaped as an artifact's, decoded; None for any other shape. The name is
    not checked here (`mcp_celery.store.artifacts.parse_uri` does)."""
    if not uri.startswith(ARTIFACT_URI_PREFIX) or "?" in uri or "#" in uri:
        return None
    parts = uri[len(ARTIFACT_URI_PREFIX) :].split("/")
    if len(parts) != 3 or parts[1] != "artifacts":
        return None
    task_id, name = unquote(parts[0]), unquote(parts[2])
    return (task_id, name) if task_id and name and "/" not in task_id else None


def output_uri(task_id: str) -> str:
    """The resource URI of a task's live output (`ctx.output`, text/plain)."""
    return f"{ARTIFACT_URI_PREFIX}{quote(task_id, safe='')}/output"


def split_output_uri(uri: str) -> str | None:
    """The task id of a URI shaped as a task's output, decoded; None for any other shape."""
    if not uri.startswith(ARTIFACT_URI_PREFIX) or "?" in uri or "#" in uri:
        return None
    parts = uri[len(ARTIFACT_URI_PREFIX) :].split("/")
    if len(parts) != 2 or parts[1] != "output":
        return None
    task_id = unquote(parts[0])
    return task_id if task_id and "/" not in task_id else None


def output_dropped(text: str) -> tuple[int, str]:
    """`(bytes dropped, the rest)` of a task's output as `resources/read` gives it (`OUTPUT_DROPPED_LINE` first)."""
    found = re.match(r"\[output: ([\d,]+) earlier bytes dropped;[^\]\n]*\]\n", text)
    return (0, text) if found is None else (int(found[1].replace(",", "")), text[found.end() :])


#: The first line of a task's output once earlier bytes were dropped (the clients parse it: `output_dropped`).
OUTPUT_DROPPED_LINE = (
    "[output: {dropped:,} earlier bytes dropped; the last {kept:,} are kept (MCP_CELERY_OUTPUT_KEEP_BYTES)]\n"
)
