"""The Redis schema: key names, the task hash's field names, the record codec and the lifetime policy.

Pure (no I/O, no redis import). A task `abc` with the default prefix owns:

>>> k = Keys("mcp-celery")
>>> k.task("abc")
'mcp-celery:task:{abc}'
>>> k.answers("abc")
'mcp-celery:task:{abc}:answers'
>>> k.bell("abc")
'mcp-celery:task:{abc}:bell'
>>> k.events("abc")
'mcp-celery:task:{abc}:events'

The braces are a hash tag: Redis Cluster places every key of one task, and its event channel, in
the slot of `abc`, so that every script (which touches one task's keys only) runs on one node.
On one server they change nothing but the names. This is key layout 2 (`KEY_LAYOUT`); layout 1
named them `mcp-celery:task:abc`... (README, "Production Redis", says what an upgrade means).

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
request, outstanding input requests, whether the job is parked at one (and the message that
resumes it) and, once a terminal state has been observed, that state frozen for ever. Every change
a reader can see is PUBLISHed on the task's `events` channel.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FIELD",
    "INPUT_FIELD_PREFIX",
    "Durability",
    "JOB_FIELDS",
    "KEY_LAYOUT",
    "MEMBER_MARK",
    "OUTPUT_EVENT",
    "Keys",
    "Lifetimes",
    "TaskRecord",
    "as_text",
    "decode_hash",
    "member_id",
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
    #: Created by a client without the tasks extension: its model answers the job's questions through
    #: the task_respond tool, so the job may ask whatever the client's capabilities.
    PLAIN = "plain"
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
    #: the job starts (then the heartbeat's `alive` counts, and every reader ignores the mark): a
    #: worker lost in between leaves it to run out.
    TAKEN = "taken"
    #: On a workflow member's record: the MCP task it belongs to (its events go to that task's channel).
    PARENT = "parent"
    #: On an MCP task whose job handed it over to a workflow: the workflow (`mcp_celery.core.workflows`, JSON).
    WORKFLOW = "workflow"
    #: Set once the workflow's merge step has been launched (whoever launches it first).
    MERGING = "merging"
    #: On a parked task (its job ended its run at an open question, `mcp_celery.worker.parking`): when
    #: the question times out (ms). The answer that closes the last open request removes it and resumes.
    PARKED = "parked"
    #: The Celery signature (kombu JSON) that runs a parked job again: its own message, sent once more.
    RESUME = "resume"
    #: Bytes of the task's live output dropped so far (only the last MCP_CELERY_OUTPUT_KEEP_BYTES are kept).
    OUTPUT_DROPPED = "out-dropped"
    #: On a task an approval policy held before its job was queued: what the approval is bound to (JSON,
    #: `mcp_celery.store.gated`); with `PARKED` and `RESUME` until the decision.
    GATE = "gate"


#: What the scripts PUBLISH on a task's event channel when its live output grew (every other message
#: is a change of its state): listeners of the output act on it, and watchers of the state ignore it.
OUTPUT_EVENT = "output"

#: Prefix of the task-hash fields that hold outstanding input requests.
INPUT_FIELD_PREFIX = "in:"
#: Prefix of the task-hash fields that hold the task's artifacts (`mcp_celery.store.artifacts`).
ARTIFACT_PREFIX = "art:"

#: The record fields a starting job reads.
JOB_FIELDS = (
    FIELD.TOOL,
    FIELD.CAPABILITIES,
    FIELD.SYNC,
    FIELD.PLAIN,
    FIELD.CANCEL,
    FIELD.FIRST_ANSWERS,
    FIELD.CREATED,
    FIELD.TTL,
    FIELD.POLL,
    FIELD.ALIVE_UNTIL,  # set: an earlier delivery of the job already started
    FIELD.FINAL,  # set: the task has ended (cancelled, or its worker reported lost); the job must not run
    FIELD.OUTCOME,  # set: an earlier delivery stored how the job ended (JOB_START shows no new start)
    FIELD.LOST,  # set: why an earlier run's heartbeat stopped (JOB_START forgets it)
    FIELD.PARENT,  # set: a workflow member, whose MCP task is the parent's
    FIELD.OWNER,  # the job's log lines name its principal (hashed: mcp_celery.logs)
)


#: Between a workflow's MCP task id and a member's own part in the member's task id (`member_id`).
MEMBER_MARK = "."


def member_id(parent_id: str) -> str:
    """A new task id for a member of the workflow of MCP task `parent_id`: `parent_id.<uuid>`.

    The server's task ids are URL-safe base64 (`protocol.new_task_id`), which has no
    `MEMBER_MARK`: the part before the first one names the MCP task, and a member's keys share
    its hash tag (`Keys.task`).
    """
    return f"{parent_id}{MEMBER_MARK}{uuid.uuid4()}"


#: The version of the key names below (1: `prefix:task:ID`, 2: `prefix:task:{ID}`, hash-tagged).
KEY_LAYOUT = 2


@dataclass(frozen=True)
class Keys:
    """Every Redis key mcp-celery writes, under one prefix."""

    prefix: str = "mcp-celery"

    def task(self, task_id: str) -> str:
        # A workflow member's keys carry its MCP task's hash tag (see `member_id`): the scripts that
        # change a member announce it on the MCP task's channel, in the same slot of a cluster.
        tag, mark, own = task_id.partition(MEMBER_MARK)
        return f"{self.prefix}:task:{{{tag}}}{mark}{own}"

    def answers(self, task_id: str) -> str:
        return f"{self.task(task_id)}:answers"

    def bell(self, task_id: str) -> str:
        return f"{self.task(task_id)}:bell"

    def events(self, task_id: str) -> str:
        """The pub/sub channel on which every visible change of the task is announced."""
        return f"{self.task(task_id)}:events"

    def artifact(self, task_id: str, name: str) -> str:
        """The bytes of a task's artifact `name` (`MCP_CELERY_ARTIFACTS=redis`; `mcp_celery.store.artifacts`)."""
        return f"{self.task(task_id)}:artifact:{name}"

    def artifact_staging(self, task_id: str, name: str) -> str:
        """Where an artifact streamed into Redis is written in pieces, then renamed to `artifact` when whole."""
        return f"{self.task(task_id)}:artifact-staging:{name}"

    def output(self, task_id: str) -> str:
        """The task's live output (`ctx.output`; `mcp_celery.store.output`), expiring with the record."""
        return f"{self.task(task_id)}:output"

    def live(self) -> str:
        """Sorted set of running tasks scored by the time their heartbeat runs out (ms).

        With a Redis broker, a task enters it when created, scored by when to look for its message
        if no job has started by then (`mcp_celery.server.engine.reaper`). A worker that takes the job's
        message scores it by its `taken` deadline, and JOB_START by the heartbeat's.

        One key for every task, so on a cluster it lives in another slot than a task's keys, and
        no script touches it. The record is what counts (a server reads the deadline there before it
        decides anything); the set only says when to look, so each write goes where losing the
        other half is harmless: a start's and a beat's just before the script, in the same pipeline
        (a process that dies between leaves an entry too many, which the reaper's next look drops);
        a `taken` mark's just after the script and only if it marked, both before the ack (a worker
        lost in between has not acked: the broker hands the message out again); a `taken` beat's
        only for a task still in the set (XX), which may score a job that started meanwhile up to
        one beat period late. Never a watched task missing from the set.
        """
        return f"{self.prefix}:live"

    def parked(self) -> str:
        """Sorted set of the parked tasks (`FIELD.PARKED`), scored by when each asked (ms).

        An index for `mcp-celery top` and the metrics only, written beside the scripts as `live` is
        (one key for every task): added in the park's pipeline, taken out when the job resumes, is
        cancelled or its question times out. The record is what counts.
        """
        return f"{self.prefix}:parked"

    def approval(self, approval_id: str) -> str:
        """Which task and input request an approval page's id stands for (JSON `{task, key}`), while it may be open."""
        return f"{self.prefix}:approval:{approval_id}"

    def approvals(self) -> str:
        """Sorted set of the approval ids asked, scored by when (ms): an index for the page's list only.

        Written beside the question as `parked` is (one key for every task); the record is what counts,
        and an id whose request is no longer open is dropped when the list is read.
        """
        return f"{self.prefix}:approvals"

    def sign_ins(self, source: str) -> str:
        """Counter of the approval page's sign-in attempts from one source (a digest), expiring with its window."""
        return f"{self.prefix}:sign-ins:{source}"

    def session(self, digest: str) -> str:
        """A signed-in session (JSON; `mcp_celery.server.edge.sessions`), under a digest of its id, expiring with it."""
        return f"{self.prefix}:session:{digest}"

    def sign_in_attempt(self, state_digest: str) -> str:
        """An OpenID Connect sign-in on its way through the provider (JSON), under a digest of its `state`.

        Written when the page sends a person to the provider, taken (GETDEL: once) when they come back;
        expires on its own if they never do.
        """
        return f"{self.prefix}:sign-in-attempt:{state_digest}"

    def ended(self) -> str:
        """Stream of the tasks that ended (`mcp_celery.store.ended`); not kept on a cluster store."""
        return f"{self.prefix}:ended"

    def workers(self) -> str:
        """Sorted set of the worker processes that beat, scored by when their beat runs out (ms)."""
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        """What worker process `worker_id` (host:pid) runs, as its last beat said (JSON; expires with the beat)."""
        return f"{self.prefix}:worker:{worker_id}"

    def figures_lease(self) -> str:
        """Which server replica reports the deployment-wide gauges now (a short lease, SET NX PX)."""
        return f"{self.prefix}:figures-lease"

    def state_secret(self) -> str:
        """The key that signs MRTR `requestState`s, shared by every server of the deployment (made once)."""
        return f"{self.prefix}:request-state-key"

    def owner_tasks(self, principal: str) -> str:
        """Sorted set (score: creation ms) of a principal's task ids; kept only with a live-task quota."""
        return f"{self.prefix}:owner:{principal}"

    def idempotency_key(self, principal: str, key: str) -> str:
        """The task a principal's idempotency key names (a claim, `mcp_celery.server.engine.repeats`).

        Named by a digest, so that neither the key nor the principal shows in Redis, and hash-tagged
        by it: the claim is one key, in a slot of its own on a cluster.

        >>> Keys().idempotency_key("alice", "k-1")
        'mcp-celery:idempotency:{cb664db72064f28a214cb2bf3ad26f13}'
        """
        return f"{self.prefix}:idempotency:{{{_pair_digest(principal, key)}}}"

    def recent_call(self, principal: str, call: str) -> str:
        """The task a principal's call (`mcp_celery.core.calls.call_digest`) made within its tool's dedupe window."""
        return f"{self.prefix}:recent-call:{{{_pair_digest(principal, call)}}}"


def _pair_digest(principal: str, text: str) -> str:
    """A digest of (principal, text) that no other pair shares (the principal's length goes first)."""
    return hashlib.sha256(f"{len(principal)}:{principal}{text}".encode()).hexdigest()[:32]


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
class Durability:
    """How many replicas must confirm a task's creation, an answer and a cancel before they are acknowledged.

    Args:
        min_replicas: 0 (the default): acknowledged once the primary has them.
        wait_ms: the longest wait for the replicas (Redis WAIT's timeout).
    """

    min_replicas: int = 0
    wait_ms: int = 2000


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
    plain: bool = False
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
    parent: str | None = None
    workflow: str | None = None
    parked_until_ms: int | None = None
    #: The signature that resumes a job which parked (kept after the resume: a lost message is sent again).
    resume: str | None = None
    #: The task's artifacts: name -> its meta (JSON, `mcp_celery.store.artifacts.ArtifactMeta`), in write order.
    artifacts: dict[str, str] = field(default_factory=lambda: {})
    #: Held by the approval policy before its job was queued: what the approval is bound to (`FIELD.GATE`).
    gate: dict[str, Any] | None = None

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
        if self.plain:
            fields[FIELD.PLAIN] = "1"
        if self.parent:
            fields[FIELD.PARENT] = self.parent
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
            plain=bool(raw.get(FIELD.PLAIN)),
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
            parent=raw.get(FIELD.PARENT) or None,
            workflow=raw.get(FIELD.WORKFLOW) or None,
            parked_until_ms=_int_or_none(raw.get(FIELD.PARKED)),
            resume=raw.get(FIELD.RESUME) or None,
            artifacts={k[len(ARTIFACT_PREFIX) :]: v for k, v in raw.items() if k.startswith(ARTIFACT_PREFIX)},
            gate=_json_or_none(raw.get(FIELD.GATE)),
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
