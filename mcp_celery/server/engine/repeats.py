"""Repeated tool calls: the task an earlier call made, handed out again instead of running the job twice.

Server tier, the task service's floor (issue 47). When the reply to a `tools/call` is lost, a client
cannot tell whether the task was created, and calls again. Two things make that second call find the
first one's task rather than create another:

* An idempotency key (the client's, per call): the first call with a key claims it for the task it
  creates; every later call of the same principal with that key gets that task for as long as the
  claim and the task's record live, ended or not. The key with another call (another tool or other
  arguments, compared by `mcp_celery.core.calls.call_digest`) is refused with -32602.
* A tool's dedupe window (`dedupe_s`), for callers that send no key: a call of the same principal,
  tool and arguments as one whose task has not ended and was created less than the window ago gets
  that task. Once it has ended, the same call makes a new task (deploying twice on purpose works).

A claim is one Redis key (`Keys.idempotency_key`, `Keys.recent_call`) taken by one script
(`scripts.CLAIM_CALL`): of any number of calls racing with one key, one creates the task and the
others find it. The claim is written before the task's record; a call that finds a claim whose
record is not there yet waits for it (the first call is creating it), and one that finds it gone
after `CREATION_GRACE_S` (the first call's server died while creating it, or the record expired)
takes the claim over. A creation that fails gives its claim back (`Claim.release`), so the retry
that follows a refused call (quota, broker down) is not refused for ever.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from redis.exceptions import RedisError

from mcp_celery.core.calls import call_digest
from mcp_celery.core.status import Found
from mcp_celery.core.tools import ToolSpec
from mcp_celery.protocol import INTERNAL_ERROR, INVALID_PARAMS, now_ms
from mcp_celery.server.ops import observe
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.schema import TaskRecord

__all__ = ["CREATION_GRACE_S", "Claim", "Repeats", "key_reused"]

#: How long a claim whose task's record is missing counts as a creation under way (then: taken over).
CREATION_GRACE_S = 10.0
#: The pauses between two looks at a task another call is creating (its record is one round trip away).
_PAUSES_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

#: Finds a task for a principal, as the task service does (the owner check included).
FindTask = Callable[[str, str], Awaitable[Found | None]]
#: Creates a task: writes its record and queues its job (the task service's `create`).
CreateTask = Callable[[ToolSpec, TaskRecord, dict[str, Any]], Awaitable[None]]


def key_reused(key: str) -> MCPError:
    """The -32602 of an idempotency key sent with another call than the one it was first used for."""
    shown = key if len(key) <= 64 else key[:64] + "..."
    return MCPError(
        INVALID_PARAMS,
        f"idempotency key {shown!r} was used for another call (another tool or other arguments); "
        "send a new key with a new call",
    )


@dataclass(frozen=True)
class Claim:
    """What a call holds: nothing (`earlier` None, no key), or a claim its new task must stand behind, or
    the task of the earlier call it repeats (`earlier`)."""

    redis_key: str | None = None
    value: str = ""
    #: The earlier call's task, when this call repeats one: nothing is to be created.
    earlier: Found | None = None

    async def release(self, store: AsyncStore) -> None:
        """Give the claim back: its task could not be created (best effort: it expires anyway)."""
        if self.redis_key is not None:
            with contextlib.suppress(RedisError, OSError):
                await store.release_call(self.redis_key, self.value)


@dataclass(frozen=True)
class _Held:
    """A claim another call holds, as stored: its task, its call's digest, when it was made (ms)."""

    task_id: str
    call: str
    at_ms: int

    @classmethod
    def parse(cls, text: str) -> _Held:
        raw = json.loads(text)
        return cls(str(raw["task"]), str(raw["call"]), int(raw["at"]))


class Repeats:
    """Claims calls for new tasks, and finds the earlier call's task for a call that repeats one."""

    def __init__(self, store: AsyncStore, find: FindTask, key_lifetime_ms: int, default_window_s: float) -> None:
        self.store = store
        self.find = find
        #: A key's claim lives as long as a new task's record does at first (`Lifetimes.live_s`).
        self.key_lifetime_ms = key_lifetime_ms
        #: The dedupe window of a tool without one of its own (the dedupe_s setting).
        self.default_window_s = default_window_s

    async def create_unless_repeated(
        self,
        create: CreateTask,
        spec: ToolSpec,
        record: TaskRecord,
        arguments: dict[str, Any],
        key: str | None,
    ) -> Found | None:
        """`create` the task of `record`, unless the call repeats an earlier one: then that call's task.

        Raises:
            MCPError: as `create` (the claim is given back then), and as `claim`.
        """
        window_s = self.default_window_s if spec.dedupe_s is None else spec.dedupe_s
        claim = await self.claim(record, arguments, key, window_s)
        if claim.earlier is not None:
            observe.repeated(claim.earlier[0].task_id, spec.name, record.owner, key)
            return claim.earlier
        try:
            await create(spec, record, arguments)
        except Exception:
            await claim.release(self.store)  # refused or failed: the retry that follows may create it
            raise
        return None

    async def claim(self, record: TaskRecord, arguments: Mapping[str, Any], key: str | None, window_s: float) -> Claim:
        """Claim the call `record` is about to be created for, or find the task of the call it repeats.

        A call with `key` is decided by its key alone; without one, by the tool's dedupe window
        (`window_s`, 0: none, and nothing is claimed).

        Raises:
            MCPError: -32602 for a key used with another call; -32603 when the call holding the claim has
                not written its task within `CREATION_GRACE_S` (try again).
        """
        if key is None and not window_s > 0:
            return Claim()
        call = call_digest(record.tool, arguments)
        keys = self.store.keys
        if key is not None:
            redis_key, lifetime_ms = keys.idempotency_key(record.owner, key), self.key_lifetime_ms
        else:
            redis_key, lifetime_ms = keys.recent_call(record.owner, call), max(int(window_s * 1000), 1)
        mine = json.dumps({"task": record.task_id, "call": call, "at": record.created_ms})
        replacing = ""
        deadline = anyio.current_time() + CREATION_GRACE_S
        for attempt in range(10_000):
            held_text = await self.store.claim_call(redis_key, mine, lifetime_ms, replacing)
            if held_text is None:
                return Claim(redis_key, mine)
            held = _Held.parse(held_text)
            if held.call != call:
                raise key_reused(str(key))  # a window's claim is named by its call: only a key can differ
            found = await self.find(record.owner, held.task_id)
            if found is not None and (key is not None or not found[1].terminal):
                return Claim(earlier=found)
            if found is not None or now_ms() - held.at_ms > CREATION_GRACE_S * 1000:
                replacing = held_text  # ended (a window's), or its record is gone: this call takes it over
                continue
            if anyio.current_time() > deadline:
                break
            await anyio.sleep(_PAUSES_S[min(attempt, len(_PAUSES_S) - 1)])  # the first call is writing it
        raise MCPError(INTERNAL_ERROR, "an earlier call with the same key is still creating its task; try again")
