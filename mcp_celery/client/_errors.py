"""Errors of the task client.

McpCeleryError (mcp_celery.errors, the one tree)
 └── TaskError                 a task did not give a tool result (carries the last DetailedTask)
      ├── TaskCancelledError   the task ended `cancelled`
      ├── TaskInputError       the task asked for input this client cannot give
      ├── NotATaskError        the server answered a tool call inline (carries the CallToolResult)
      └── TaskFailedError      the task ended `failed`: also the SDK's MCPError, so its JSON-RPC error
                               is caught like any other one (`except MCPError`) as well as by `except TaskError`
"""

from __future__ import annotations

from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from mcp_celery.errors import McpCeleryError
from mcp_celery.protocol import DetailedTask

__all__ = ["NotATaskError", "TaskCancelledError", "TaskError", "TaskFailedError", "TaskInputError"]


class TaskError(McpCeleryError):
    """A task did not give a tool result; `task` is the last DetailedTask read (None if none was)."""

    def __init__(self, message: str, task: DetailedTask | None = None) -> None:
        super().__init__(message)
        self.task = task


class TaskCancelledError(TaskError):
    """The task ended `cancelled` (by this client or another)."""


class TaskInputError(TaskError):
    """The task asked for input the client cannot give: no callback for it, or the callback declined with an error.

    The task stays `input_required`; answer it from a client that can, or cancel it.
    """


class NotATaskError(TaskError):
    """The server ran the tool call synchronously; `result` is its CallToolResult."""

    def __init__(self, result: CallToolResult) -> None:
        super().__init__("the server answered the tool call inline instead of starting a task")
        self.result = result


class TaskFailedError(TaskError, MCPError):
    """The task ended `failed`; `code`, `message` and `data` are the task's JSON-RPC error."""

    def __init__(self, task: DetailedTask) -> None:
        error = task.error
        MCPError.__init__(
            self,
            error.code if error else -32603,
            error.message if error else (task.status_message or "task failed"),
            error.data if error else None,
        )
        self.task: DetailedTask | None = task
