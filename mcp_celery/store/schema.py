"""The Redis schema: key names, the task hash's field names, the record codec and the lifetime policy.

Pure (no I/O, no redis import). A task `abc` with the default prefix owns:

>>> k = Keys("mcp-celery")
>>> k.task("abc")
'mcp-celery:task:abc'
>>> k.answers("abc")
'mcp-celery:task:abc:answers'
>>> k.bell("abc")
'mcp-celery:task:abc:bell'
>>> k.events("abc")
'mcp-celery:task:abc:events'

The task hash holds the record (tool, createdAt, TTL, client capabilities, owner, cancel
request, the job's progress and outcome, frozen terminal state) and one field per outstanding
input request (`in:<key>`), so that `tasks/get` is a single HGETALL, whatever Celery's result
backend is (Redis, a database, or none).
The answers hash keeps every delivered answer for replay after a redelivery; the bell
is a list used as a doorbell (BLPOP) that wakes a job waiting for input or cancel. A running
job's heartbeat keeps `alive` (ms) in the future and the task in the `live` sorted set, scored
by the same time, so that any server finds the tasks whose worker stopped beating. Before that,
from the moment a worker takes an at-most-once job's message (Celery's early ack) until the job
starts, the worker's main process beats `taken` the same way.
With `MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL` set, `owner:<principal>` is a sorted set of
the task ids that principal created, pruned of finished ones when counted.

The worker writes how the job is doing into the record, in the shape of Celery's result meta
(`{"status": "PROGRESS", "result": {...}}`): `progress` while it runs (STARTED, PROGRESS) and
`outcome` once it ended (SUCCESS, FAILURE, REVOKED; the first outcome wins). Beside that, the
record says what Celery cannot: that the task exists at all (a queued and an unknown id both read
PENDING in Celery), when it was created, its TTL, the client's capabilities, its owner, a cancel
request, outstanding input requests and, once a terminal state has been observed, that state
frozen for ever. Every change a reader can see is PUBLISHed on the task's `events` channel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FIELD",
    "INPUT_FIELD_PREFIX",
    "JOB_FIELDS",
    "Keys",
    "Lifetimes",
    "TaskRecord",
    "as_text",
    "decode_hash",
]


class FIELD:
    """Names of the task hash's fields; the Lua scripts are built from these too."""

    TOOL = "tool"
    CREATED = "created"
    TTL = "ttl"
    POLL = "poll"
    CAPABILITIES = "caps"
    OWNER = "owner"
    SYNC = "sync"
    FIRST_ANSWERS = "first"
    CANCEL = "cancel"
    UPDATED = "updated"
    FINAL = "final"
    ALIVE_UNTIL = "alive"
    PROGRESS = "progress"
    OUTCOME = "outcome"
    RUNS = "runs"  # starts of a retry_on_worker_loss job (counted only for those)
    #: Why the job's heartbeat is about to stop (its worker is shutting down); shown if it does.
    LOST = "lost"
    #: A worker took the job's message (Celery acked it early) and beats this deadline (ms) until
    #: the job starts (JOB_START removes it): a worker lost in between leaves it to run out.
    TAKEN = "taken"


#: Prefix of the task-hash fields that hold outstanding input requests.
INPUT_FIELD_PREFIX = "in:"

#: The record fields a starting job reads.
JOB_FIELDS = (
    FIELD.TOOL,
    FIELD.CAPABILITIES,
    FIELD.SYNC,
    FIELD.CANCEL,
    FIELD.FIRST_ANSWERS,
    FIELD.CREATED,
    FIELD.TTL,
    FIELD.POLL,
    FIELD.ALIVE_UNTIL,  # set: an earlier delivery of the job already started
    FIELD.FINAL,  # set: the task has ended (its worker was reported lost); the job must not run
)


@dataclass(frozen=True)
class Keys:
    """Every Redis key mcp-celery writes, under one prefix."""

    prefix: str = "mcp-celery"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def answers(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:answers"

    def bell(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:bell"

    def events(self, task_id: str) -> str:
        """The pub/sub channel on which every visible change of the task is announced."""
        return f"{self.prefix}:task:{task_id}:events"

    def live(self) -> str:
        """Sorted set of running tasks scored by the time their heartbeat runs out (ms).

        With a Redis broker, a task enters it when created, scored by when to look for its message
        if no job has started by then (`mcp_celery.server.reaper`). A worker that takes the job's
        message scores it by its `taken` deadline, and JOB_START by the heartbeat's.
        """
        return f"{self.prefix}:live"

    def owner_tasks(self, principal: str) -> str:
        """Sorted set (score: creation ms) of a principal's task ids; kept only with a live-task quota."""
        return f"{self.prefix}:owner:{principal}"


@dataclass(frozen=True)
class Lifetimes:
    """How long records live; the store applies this policy, callers never pass expiries around.

    Args:
        ttl_s: how long a finished task stays readable (Celery's result_expires); None: for ever.
        max_job_s: the longest a job may run; a live record is kept TTL plus this, so it
            never expires before the job that owns it.
    """

    ttl_s: int | None
    max_job_s: int

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl_s is None else self.ttl_s * 1000

    @property
    def live_s(self) -> int:
        """Lifetime of a record whose job has not finished (refreshed when the job starts)."""
        return self.live_for(self.max_job_s)

    def live_for(self, job_s: int) -> int:
        """Lifetime of a running record whose job may run `job_s` seconds: it outlives the job by the TTL."""
        return (self.ttl_s or 365 * 86400) + job_s


@dataclass(frozen=True)
class TaskRecord:
    """One task's record, decoded."""

    task_id: str
    tool: str
    created_ms: int
    ttl_ms: int | None
    poll_ms: int
    capabilities: dict[str, Any] = field(default_factory=lambda: {})
    owner: str = ""
    sync: bool = False
    cancel_ms: int | None = None
    updated_ms: int | None = None
    final: dict[str, Any] | None = None
    alive_until_ms: int | None = None
    progress: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    lost_reason: str | None = None
    taken_until_ms: int | None = None
    inputs: dict[str, Any] = field(default_factory=lambda: {})
    first_answers: dict[str, Any] = field(default_factory=lambda: {})

    def to_hash(self) -> dict[str, str]:
        """Fields written when the task is created (the rest are written as it runs)."""
        fields = {
            FIELD.TOOL: self.tool,
            FIELD.CREATED: str(self.created_ms),
            FIELD.TTL: "" if self.ttl_ms is None else str(self.ttl_ms),
            FIELD.POLL: str(self.poll_ms),
            FIELD.CAPABILITIES: json.dumps(self.capabilities),
            FIELD.OWNER: self.owner,
            FIELD.SYNC: "1" if self.sync else "",
        }
        if self.first_answers:
            fields[FIELD.FIRST_ANSWERS] = json.dumps(self.first_answers)
        return fields

    @classmethod
    def from_hash(cls, task_id: str, raw: Mapping[str, str]) -> TaskRecord | None:
        """Decode an HGETALL reply; None when the record is missing or incomplete."""
        if FIELD.TOOL not in raw or FIELD.CREATED not in raw:
            return None
        inputs = {
            k[len(INPUT_FIELD_PREFIX) :]: json.loads(v) for k, v in raw.items() if k.startswith(INPUT_FIELD_PREFIX)
        }
        return cls(
            task_id=task_id,
            tool=raw[FIELD.TOOL],
            created_ms=int(raw[FIELD.CREATED]),
            ttl_ms=_int_or_none(raw.get(FIELD.TTL)),
            poll_ms=int(raw.get(FIELD.POLL) or 1000),
            capabilities=json.loads(raw.get(FIELD.CAPABILITIES) or "{}"),
            owner=raw.get(FIELD.OWNER, ""),
            sync=bool(raw.get(FIELD.SYNC)),
            cancel_ms=_int_or_none(raw.get(FIELD.CANCEL)),
            updated_ms=_int_or_none(raw.get(FIELD.UPDATED)),
            final=_json_or_none(raw.get(FIELD.FINAL)),
            alive_until_ms=_int_or_none(raw.get(FIELD.ALIVE_UNTIL)),
            progress=_json_or_none(raw.get(FIELD.PROGRESS)),
            outcome=_json_or_none(raw.get(FIELD.OUTCOME)),
            lost_reason=raw.get(FIELD.LOST) or None,
            taken_until_ms=_int_or_none(raw.get(FIELD.TAKEN)),
            inputs=inputs,
            first_answers=json.loads(raw.get(FIELD.FIRST_ANSWERS) or "{}"),
        )

    @property
    def job(self) -> dict[str, Any] | None:
        """How the job is doing, as Celery's result meta would say it (None: not started yet)."""
        return self.outcome if self.outcome is not None else self.progress

    @classmethod
    def from_job_fields(cls, task_id: str, fields: Mapping[str, str]) -> TaskRecord:
        """The partial record a starting job reads (JOB_FIELDS only)."""
        record = cls.from_hash(task_id, fields)
        if record is None:
            raise ValueError(f"task {task_id}: the record lacks {FIELD.TOOL!r} or {FIELD.CREATED!r}")
        return record


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value else None


def _json_or_none(value: str | None) -> Any:
    return json.loads(value) if value else None


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in raw.items()}


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
