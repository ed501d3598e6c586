"""Hostile input: request limits, the per-principal live-task quota, and error text without secrets.

Every limit is a `Settings` field (`MCP_CELERY_MAX_*`) and breaking one gets a JSON-RPC error
that names the setting. The HTTP body limit is the SDK's own (HTTP 413 before parsing), and
malformed JSON is the SDK's -32700; the rest is checked here, in the handlers, so stdio and
HTTP behave the same.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import anyio
import mcp_types as types
import pydantic
from kombu.exceptions import OperationalError
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from mcp_celery.errors import STORE_UNAVAILABLE, jsonrpc_error
from mcp_celery.protocol import INVALID_PARAMS
from mcp_celery.redact import redact
from mcp_celery.settings import Settings
from mcp_celery.store.aio import AsyncStore, NotReplicated
from mcp_celery.store.schema import TaskRecord

__all__ = [
    "AnswerUnreadable",
    "QUOTA_EXCEEDED",
    "STORE_UNAVAILABLE",
    "check_arguments",
    "check_input_responses",
    "describe",
    "enforce_quota",
    "json_depth",
    "quota_error",
    "safe_errors",
    "task_id_acceptable",
]

logger = logging.getLogger(__name__)

#: JSON-RPC "Invalid Request": the request is well formed but this principal may not create more tasks now.
QUOTA_EXCEEDED = -32600

#: What a client is told while the task store cannot be reached (Redis restarting, a Sentinel failover).

R = TypeVar("R")


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value (a scalar is 0, `[]` is 1); stops counting past `limit`.

    Iterative, so a hostile value cannot exhaust the interpreter's stack.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, Mapping):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def _check_json(what: str, value: Any, max_bytes: int, max_bytes_setting: str, settings: Settings) -> None:
    depth = json_depth(value, settings.max_json_depth)
    if depth > settings.max_json_depth:
        raise MCPError(
            INVALID_PARAMS,
            f"{what} nested deeper than {settings.max_json_depth} levels (MCP_CELERY_MAX_JSON_DEPTH)",
        )
    size = _size(value)
    if size > max_bytes:
        raise MCPError(
            INVALID_PARAMS, f"{what} too large: {size} bytes as JSON, the limit is {max_bytes} ({max_bytes_setting})"
        )


def check_arguments(settings: Settings, arguments: Mapping[str, Any] | None) -> None:
    """Raises MCPError -32602 for tool arguments too deep or too large; nothing is queued then."""
    if arguments:
        _check_json("tool arguments", arguments, settings.max_argument_bytes, "MCP_CELERY_MAX_ARGUMENT_BYTES", settings)


def check_input_responses(settings: Settings, responses: Mapping[str, Any] | None) -> None:
    """Raises MCPError -32602 for inputResponses with too many keys, too deep or too large."""
    if not responses:
        return
    if len(responses) > settings.max_input_response_keys:
        raise MCPError(
            INVALID_PARAMS,
            f"inputResponses has {len(responses)} keys, the limit is {settings.max_input_response_keys} "
            "(MCP_CELERY_MAX_INPUT_RESPONSE_KEYS)",
        )
    _check_json(
        "inputResponses", responses, settings.max_input_response_bytes, "MCP_CELERY_MAX_INPUT_RESPONSE_BYTES", settings
    )


def task_id_acceptable(settings: Settings, task_id: str) -> bool:
    """False for ids no task can have; the caller answers as for an unknown task, without touching Redis."""
    return 0 < len(task_id) <= settings.max_task_id_length


async def enforce_quota(store: AsyncStore, owner: str, limit: int | None) -> None:
    """Raise the quota error when `owner` has `limit` unfinished tasks; finished and vanished ones are pruned.

    A soft limit: two creates racing past the count may both succeed.
    """
    if limit is None:
        return
    tasks = await store.owned(owner)
    done = [task_id for task_id, record in tasks if not _live(record)]
    if done:
        await store.disown(owner, done)
    live = len(tasks) - len(done)
    if live >= limit:
        raise quota_error(live, limit)


def _live(record: TaskRecord | None) -> bool:
    # Cancelled counts as finished at once: the job is on its way out and the client is done with it.
    return record is not None and record.final is None and record.cancel_ms is None and record.outcome is None


def quota_error(live: int, limit: int) -> MCPError:
    return MCPError(
        QUOTA_EXCEEDED,
        f"too many live tasks: {live} unfinished, the limit is {limit} per principal "
        "(MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL); wait for one to finish or cancel one",
        {"liveTasks": live, "limit": limit},
    )


# ---------------------------------------------------------------- error text


#: Redis gone away mid-request (a restart, a failover), redis-py's retries run out.
STORE_DOWN = (RedisConnectionError, RedisTimeoutError, ReadOnlyError)
#: A broker or Redis that cannot be reached.
UNREACHABLE = (*STORE_DOWN, OperationalError, OSError)


def describe(exc: BaseException, settings: Settings) -> str:
    """What a client may see of an unexpected exception (`mcp_celery.errors.jsonrpc_error`): its type, and
    its message only in debug mode; a broker or Redis that cannot be reached is said as such."""
    return jsonrpc_error(exc, debug=settings.debug, unreachable=UNREACHABLE)[1]


def to_mcp_error(exc: BaseException, settings: Settings) -> MCPError:
    """The SDK's MCPError a request handler raises for `exc` (`mcp_celery.errors.jsonrpc_error`)."""
    return MCPError(*jsonrpc_error(exc, debug=settings.debug, store_down=STORE_DOWN, unreachable=UNREACHABLE))


def safe_errors(settings: Settings, handler: Callable[[Any, Any], Awaitable[R]]) -> Callable[[Any, Any], Awaitable[R]]:
    """Wrap a request handler so an unexpected exception reaches the client as a bare -32603.

    The SDK's stdio path would otherwise send `str(exc)` (a Redis or broker error can carry a
    host name or a URL with its password); the server log keeps the whole traceback.
    """

    @functools.wraps(handler)
    async def guarded(ctx: Any, params: Any) -> R:
        try:
            return await handler(ctx, params)
        except (MCPError, pydantic.ValidationError):
            raise  # the SDK maps these itself (a ValidationError to -32602 without pydantic's text)
        except NotReplicated as exc:
            raise to_mcp_error(exc, settings) from exc
        except STORE_DOWN as exc:
            # Not a bug: Redis went away (restart, failover) and redis-py's retries ran out. Says so, and no more.
            logger.warning("%s: %s", getattr(ctx, "method", "request"), redact(str(exc)) or type(exc).__name__)
            raise to_mcp_error(exc, settings) from exc
        except Exception as exc:
            logger.exception("%s failed", getattr(ctx, "method", "request"))
            raise to_mcp_error(exc, settings) from exc

    return guarded


# ---------------------------------------------------------------- stdio: unreadable lines


class AnswerUnreadable:
    """The stdio read stream, answering each line it cannot read instead of dropping it silently.

    The SDK's stdio transport hands an unreadable line to the server as an exception, which
    it only logs; JSON-RPC asks for an error reply with a null id: -32700 for text that is not
    JSON, -32600 for JSON that is not a JSON-RPC message. HTTP already answers both.
    """

    def __init__(self, read: Any, write: Any) -> None:
        self._read = read
        self._write = write

    @property
    def last_context(self) -> Any:
        return getattr(self._read, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self._read.receive()
            if not isinstance(item, Exception):
                return item
            not_json = isinstance(item, pydantic.ValidationError) and any(
                e.get("type") == "json_invalid" for e in item.errors()
            )
            code, message = (PARSE_ERROR, "Parse error") if not_json else (INVALID_REQUEST, "Invalid Request")
            error = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=message))
            await self._write.send(SessionMessage(error))

    def __aiter__(self) -> AnswerUnreadable:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._read.close()

    async def aclose(self) -> None:
        await self._read.aclose()

    async def __aenter__(self) -> AnswerUnreadable:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
