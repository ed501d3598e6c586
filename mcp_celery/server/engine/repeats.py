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

A claim is one Redis key (`Keys.idempotency_key`, `Keys.recent_call`) taken by one script: of any
number of calls racing with one key, one creates the task and the others find it. On one Redis
server the claim and the record's write are one script (`scripts.CLAIM_AND_CREATE`), so a call with
a key costs the round trips of one without; on a cluster (the claim is in a slot of its own), and
under a live-task quota, the claim is taken first (`scripts.CLAIM_CALL`). A call that finds a claim
whose record is not there yet waits for it (the first call is creating it), and one that finds it
gone after `CREATION_GRACE_S` (the first call's server died while creating it, or the record
expired) takes the claim over. A creation that fails gives its claim back, so the retry that
follows a refused call (quota, broker down) is not refused for ever.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from redis.exceptions import RedisError

from mcp_celery.core.calls import call_digest
from mcp_celery.core.status import Found
from mcp_celery.core.tools import ToolSpec
from mcp_celery.protocol import INTERNAL_ERROR, INVALID_PARAMS, now_ms
from mcp_celery.server.ops import observe
from mcp_celery.settings import Settings
from mcp_celery.store.aio import AsyncStore, CallClaim
from mcp_celery.store.schema import TaskRecord

__all__ = ["CREATION_GRACE_S", "CreateTask", "Repeats", "key_reused"]

#: How long a claim whose task's record is missing counts as a creation under way (then: taken over).
CREATION_GRACE_S = 10.0
#: The pauses between two looks at a task another call is creating (its record is one round trip away).
_PAUSES_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

#: Finds a task for a principal, as the task service does (the owner check included).
FindTask = Callable[[str, str], Awaitable[Found | None]]


class CreateTask(Protocol):
    """Creates a task (the task service's `create`): with a `claim`, unless another call holds it (returned)."""

    def __call__(
        self, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any], *, claim: CallClaim | None = None
    ) -> Awaitable[str | None]: ...


def key_reused(key: str) -> MCPError:
    """The -32602 of an idempotency key sent with another call than the one it was first used for."""
    shown = key if len(key) <= 64 else key[:64] + "..."
    return MCPError(
        INVALID_PARAMS,
        f"idempotency key {shown!r} was used for another call (another tool or other arguments); "
        "send a new key with a new call",
    )


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
    """Creates tasks behind their calls' claims, and finds the earlier call's task for a call that repeats one.

    Args:
        store: where the claims are.
        find: the task service's `find`.
        key_lifetime_ms: how long a key's claim lives: as long as a new task's record does at first.
        settings: the dedupe window of a tool without one of its own (`dedupe_s`); and, with a live-task
            quota counted before a task is written, claims are taken before it, so that a repeat is never
            refused for the quota its own first call uses.
    """

    def __init__(self, store: AsyncStore, find: FindTask, key_lifetime_ms: int, settings: Settings) -> None:
        self.store = store
        self.find = find
        self.key_lifetime_ms = key_lifetime_ms
        self.default_window_s = settings.dedupe_s
        self.claim_first = settings.max_live_tasks_per_principal is not None

    async def create_unless_repeated(
        self, create: CreateTask, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any], key: str | None
    ) -> Found | None:
        """`create` the task of `record`, unless the call repeats an earlier one: then that call's task.

        A call with `key` is decided by its key alone; without one, by the tool's dedupe window (none:
        `create` as it is, nothing claimed).

        Raises:
            MCPError: as `create` (the claim is given back then); -32602 for a key used with another call;
                -32603 when the call holding the claim has not written its task within `CREATION_GRACE_S`.
        """
        window_s = self.default_window_s if spec.dedupe_s is None else spec.dedupe_s
        if key is None and not window_s > 0:
            await create(spec, record, arguments)
            return None
        call = call_digest(record.tool, arguments)
        claim = self._claim(record, call, key, window_s)
        deadline = anyio.current_time() + CREATION_GRACE_S
        for attempt in itertools.count():
            held_text = await self._create_claimed(create, spec, record, arguments, claim)
            if held_text is None:
                return None
            held = _Held.parse(held_text)
            if held.call != call:
                raise key_reused(str(key))  # a window's claim is named by its call: only a key can differ
            found = await self.find(record.owner, held.task_id)
            if found is not None and (key is not None or not found[1].terminal):
                observe.repeated(found[0].task_id, spec.name, record.owner, key)
                return found
            if found is not None or now_ms() - held.at_ms > CREATION_GRACE_S * 1000:
                claim = claim._replace(replacing=held_text)  # ended (a window's), or never written: taken over
            elif anyio.current_time() > deadline:
                break
            else:
                await anyio.sleep(_PAUSES_S[min(attempt, len(_PAUSES_S) - 1)])  # the first call is writing it
        raise MCPError(INTERNAL_ERROR, "an earlier call with the same key or arguments is still creating its task")

    def _claim(self, record: TaskRecord, call: str, key: str | None, window_s: float) -> CallClaim:
        """The claim of `record`'s call: on its key for the task's lifetime, else on its window for the window."""
        mine = json.dumps({"task": record.task_id, "call": call, "at": record.created_ms})
        if key is not None:
            return CallClaim(self.store.keys.idempotency_key(record.owner, key), mine, self.key_lifetime_ms)
        return CallClaim(self.store.keys.recent_call(record.owner, call), mine, max(int(window_s * 1000), 1))

    async def _create_claimed(
        self, create: CreateTask, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any], claim: CallClaim
    ) -> str | None:
        """Create the task behind `claim` (in its record's round trip, or first under a quota); the claim
        another call holds instead, with nothing created. A creation that fails gives the claim back."""
        try:
            if not self.claim_first:
                return await create(spec, record, arguments, claim=claim)
            if (held := await self.store.claim_call(claim)) is not None:
                return held
            await create(spec, record, arguments)
            return None
        except Exception:
            with contextlib.suppress(RedisError, OSError):  # best effort: the claim expires anyway
                await self.store.release_call(claim.key, claim.value)
            raise
