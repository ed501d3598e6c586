"""Exceptions raised by mcp-celery, and the one place they become JSON-RPC errors.

    McpCeleryError
     ├── ToolDefinitionError      a decorated function cannot become an MCP tool (import time)
     ├── ConfigurationError       the Celery app or settings cannot work (e.g. no Redis result backend)
     ├── InputNotSupported        a job asked for input the client cannot give
     └── InputTimeout             a job's input request was not answered in time
    ProtocolError                 raised by a job: the task ends `failed` with this JSON-RPC error
    TaskCancelled (BaseException) raised at a checkpoint once the client cancelled

Only `ProtocolError` and the server's own `MCPError`s reach the wire as JSON-RPC errors;
every other exception raised by a job is a tool error (`completed`, `isError: true`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigurationError",
    "InputNotSupported",
    "InputTimeout",
    "McpCeleryError",
    "ProtocolError",
    "TaskCancelled",
    "ToolDefinitionError",
]


class McpCeleryError(Exception):
    """Base class of the errors mcp-celery raises in user code."""


class ToolDefinitionError(McpCeleryError):
    """A function or Celery task cannot be exposed as an MCP tool; the message says why."""


class ConfigurationError(McpCeleryError):
    """The Celery app or the settings cannot support MCP tasks; the message says how to fix it."""


class InputNotSupported(McpCeleryError):
    """The job asked the client for input it cannot provide.

    Raised when the client did not declare the needed capability (elicitation, sampling,
    roots) on the `tools/call` that created the task, or when the tool was called
    synchronously (a `task_mode="forbidden"` tool, or a client without the tasks extension
    while MCP_CELERY_TOOL_FALLBACK is false), where a job cannot ask anything. A task created
    by a client without the extension may ask anything: its questions are answered through
    the `task_respond` tool.
    """


class InputTimeout(McpCeleryError):
    """The client did not answer the job's input request within the timeout."""


class ProtocolError(Exception):
    """Raise in a job to end its task `failed` with a JSON-RPC error.

    Args:
        code: the JSON-RPC error code, e.g. -32602 for bad parameters.
        message: a short human-readable description.
        data: optional JSON-serializable details.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data

    def __str__(self) -> str:
        return f"{self.message} (code {self.code})"


class TaskCancelled(BaseException):
    """The client cancelled the task; raised at the job's next checkpoint.

    It derives from BaseException so that a job's own `except Exception:` around a
    checkpoint does not swallow the cancellation and carry on working.
    """
