"""Exceptions raised by mcp-celery, and the one place they become JSON-RPC errors.

    McpCeleryError
     ├── ToolDefinitionError      a decorated function cannot become an MCP tool (import time)
     ├── ConfigurationError       the Celery app or settings cannot work (e.g. no Redis result backend)
     │    ├── RedisUnreachable    (store.probe) no Redis answers at the configured URL
     │    └── StoreMismatch       a worker refused a job created in another task store than its own
     ├── InputNotSupported        a job asked for input the client cannot give
     ├── InputTimeout             a job's input request was not answered in time
     ├── ArtifactError            a job's artifact has a bad name, or is over the task's quota
     ├── ProtocolError            raised by a job: the task ends `failed` with this JSON-RPC error
     ├── NotReplicated            a write fewer Redis replicas confirmed than asked for
     │    └── NotOnPrimary        (store.replication) the write reached a replaced primary
     ├── TaskError                (client) a task did not give a tool result
     │    ├── TaskCancelledError, TaskInputError, NotATaskError
     │    └── TaskFailedError     the task ended `failed` (an `mcp` MCPError too: its JSON-RPC error)
     └── RefusedError             (client CLI) the server refused the request over HTTP

    JobSignal (BaseException)     control flow that ends a job's run, never an error
     ├── TaskCancelled            raised at a checkpoint once the client cancelled
     ├── JobParked                (worker.parking) the job parked at an open question
     └── WorkflowStarted          (worker.workflow) the job handed its task over to a workflow

Only `ProtocolError` and the server's own `MCPError`s reach the wire as JSON-RPC errors;
every other exception raised by a job is a tool error (`completed`, `isError: true`). Which
JSON-RPC error any exception becomes is decided by one function, `jsonrpc_error`: the server's
request handlers (`mcp_celery.server.edge.limits.safe_errors`) and the reading of a job's failure
from Celery's result backend (`mcp_celery.core.status`) both go through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_celery.protocol import INTERNAL_ERROR
from mcp_celery.redact import redact

__all__ = [
    "STORE_UNAVAILABLE",
    "ArtifactError",
    "ConfigurationError",
    "InputNotSupported",
    "InputTimeout",
    "JobSignal",
    "McpCeleryError",
    "NotReplicated",
    "ProtocolError",
    "StoreMismatch",
    "TaskCancelled",
    "ToolDefinitionError",
    "jsonrpc_error",
    "protocol_error_of",
]

#: What a client is told when Redis went away mid-request (a restart, a failover).
STORE_UNAVAILABLE = "the task store (Redis) is unavailable right now, e.g. failing over to a replica; try again"
#: What a client is told of an unexpected exception outside debug mode.
INTERNAL = "internal error (the server log has the details)"
#: What a client is told when the broker or Redis cannot be reached: worth a retry.
UNREACHABLE = "the broker or Redis is unreachable right now, e.g. failing over to a replica; try again"


class McpCeleryError(Exception):
    """Base class of the errors mcp-celery raises in user code."""


class ToolDefinitionError(McpCeleryError):
    """A function or Celery task cannot be exposed as an MCP tool; the message says why."""


class ConfigurationError(McpCeleryError):
    """The Celery app or the settings cannot support MCP tasks; the message says how to fix it."""


class StoreMismatch(ConfigurationError):
    """A worker refused a job whose task was created in another task store than the worker's own.

    Its message names both stores and the setting to make the same; the job's Celery state is FAILURE
    with it, and the servers end the task `failed` with the same message (`mcp_celery.server.engine.reaper`).
    """


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


class ArtifactError(McpCeleryError):
    """`JobContext.artifact` refused a file: its name is not allowed, or the task's quota is used up."""


class ProtocolError(McpCeleryError):
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


class NotReplicated(McpCeleryError):
    """A write not acknowledged: fewer replicas than `Durability.min_replicas` confirmed it within
    `Durability.wait_ms` (`mcp_celery.store.replication.check_replicas`). It may stand on the primary;
    a failover now could lose it."""


class JobSignal(BaseException):
    """Raised through a job's code to end its run: a cancel, a park, a handover to a workflow.

    Control flow, not an error: a BaseException, as asyncio's `CancelledError` is, so that a job's
    own `except Exception:` lets every one of them pass. A job that must catch more broadly lets them
    through with `except mcp_celery.JobSignal: raise` before its handler; `finally` blocks run as usual.
    """


class TaskCancelled(JobSignal):
    """The client cancelled the task; raised at the job's next checkpoint.

    A `JobSignal`, so that a job's own `except Exception:` around a checkpoint does not swallow the
    cancellation and carry on working.
    """


def jsonrpc_error(
    exc: BaseException,
    *,
    debug: bool = False,
    store_down: tuple[type[BaseException], ...] = (),
    unreachable: tuple[type[BaseException], ...] = (OSError,),
) -> tuple[int, str, Any]:
    """The JSON-RPC error (code, message, data) a client is given for `exc`: the one mapping.

    A `ProtocolError` is its own; a write the replicas did not confirm is worth sending again; a
    Redis that went away (`store_down`: the client library's connection errors, which this tier does
    not import) says so and no more; anything else is a bare internal error, its type and (redacted)
    message shown in debug mode only, since a Redis or broker error can carry a URL with its password;
    an `unreachable` broker or Redis is said as such: worth a retry.
    """
    if isinstance(exc, ProtocolError):
        return exc.code, exc.message, exc.data
    if isinstance(exc, NotReplicated):
        return INTERNAL_ERROR, f"{exc}: send it again", None
    if isinstance(exc, store_down):
        return INTERNAL_ERROR, STORE_UNAVAILABLE, None
    if debug:
        return INTERNAL_ERROR, redact(f"{type(exc).__name__}: {exc}"), None
    return INTERNAL_ERROR, UNREACHABLE if isinstance(exc, unreachable) else INTERNAL, None


def protocol_error_of(serialized: Mapping[str, Any]) -> ProtocolError | None:
    """The `ProtocolError` a job raised, from its JSON form in Celery's result backend (None: another exception).

    Celery keeps a JSON exception as its type's name and arguments (`exc_type`, `exc_message`), not the
    class, so the type is known by name here, and only here.
    """
    args = serialized.get("exc_message")
    if serialized.get("exc_type") != ProtocolError.__name__ or not isinstance(args, list) or len(args) < 2:
        return None
    if not isinstance(args[0], int):
        return None
    return ProtocolError(args[0], str(args[1]), args[2] if len(args) > 2 else None)
