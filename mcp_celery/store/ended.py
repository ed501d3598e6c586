"""The change stream of ended tasks: one entry per task that ended, for the deployment's figures.

Pure (no I/O). On one Redis server (plain or Sentinel's master) the script that ends a task adds
its entry to the `Keys.ended()` stream in the same call (XADD with MAXLEN ~ `STREAM_MAXLEN`, so the
stream stays a few megabytes): JOB_END when this call stored the job's outcome (a retry or a
redelivery stores none, so each job counts once), CANCEL for a task cancelled before its job
started, and FREEZE when a server reports a task lost with its worker. On a Redis Cluster store no
script may touch a key outside its task's slot, so there is no stream there, and no figures from it.

Readers: each server replica takes its own share of the entries through one consumer group
(`mcp_celery.server.ops.deployment_metrics`: counters and histograms, every entry counted once in the
deployment), and `mcp-celery top` reads the latest ones (XREVRANGE) for the recent failures.

>>> entry = EndedEntry("abc", "echo", "completed", created_ms=1000, ended_ms=1500, started_ms=1100)
>>> EndedEntry.from_fields(dict(zip(entry.to_args()[::2], entry.to_args()[1::2]))) == entry
True
>>> entry.queue_wait_s, entry.run_s
(0.1, 0.4)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENDED", "REASON_CHARS", "STREAM_MAXLEN", "EndedEntry"]

#: About how many entries the stream keeps (XADD MAXLEN ~): the latest ones, for consumers that lag.
STREAM_MAXLEN = 10_000
#: The longest reason kept in an entry (a failure's message; the task's own record keeps it whole).
REASON_CHARS = 200


class ENDED:
    """The field names of a stream entry; the scripts are built from these too."""

    TASK = "task"
    TOOL = "tool"
    STATUS = "status"  # completed, failed or cancelled (the MCP status the task reads)
    TOOL_ERROR = "tool_error"  # '1': completed with isError (the tool raised)
    CREATED = "created"  # ms
    STARTED = "started"  # ms, '' when the job never started (or the ending did not see it)
    ENDED = "ended"  # ms
    INPUT_MS = "input_ms"  # time the job spent waiting for input (ms)
    LOST = "lost"  # '1': ended because its worker was lost
    REASON = "reason"  # why it failed (or the tool error), '' otherwise


@dataclass(frozen=True)
class EndedEntry:
    """One ended task, as its stream entry says."""

    task_id: str
    tool: str
    status: str
    created_ms: int
    ended_ms: int
    started_ms: int | None = None
    input_ms: int = 0
    tool_error: bool = False
    lost: bool = False
    reason: str = ""

    def to_args(self) -> list[str]:
        """Field/value pairs, in the order the scripts expect (the tool and creation time second and third)."""
        return [
            ENDED.TASK, self.task_id,
            ENDED.TOOL, self.tool,
            ENDED.CREATED, str(self.created_ms) if self.created_ms else "",
            ENDED.STATUS, self.status,
            ENDED.TOOL_ERROR, "1" if self.tool_error else "",
            ENDED.STARTED, "" if self.started_ms is None else str(self.started_ms),
            ENDED.ENDED, str(self.ended_ms),
            ENDED.INPUT_MS, str(self.input_ms),
            ENDED.LOST, "1" if self.lost else "",
            ENDED.REASON, self.reason[:REASON_CHARS],
        ]  # fmt: skip

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> EndedEntry:
        return cls(
            task_id=fields.get(ENDED.TASK, ""),
            tool=fields.get(ENDED.TOOL, ""),
            status=fields.get(ENDED.STATUS, ""),
            created_ms=_int(fields.get(ENDED.CREATED)) or 0,
            ended_ms=_int(fields.get(ENDED.ENDED)) or 0,
            started_ms=_int(fields.get(ENDED.STARTED)),
            input_ms=_int(fields.get(ENDED.INPUT_MS)) or 0,
            tool_error=bool(fields.get(ENDED.TOOL_ERROR)),
            lost=bool(fields.get(ENDED.LOST)),
            reason=fields.get(ENDED.REASON, ""),
        )

    @property
    def failed(self) -> bool:
        """A failure as an operator sees it: the task failed, or its tool raised."""
        return self.status == "failed" or self.tool_error

    @property
    def queue_wait_s(self) -> float | None:
        """Creation to the job's start (None: it never started, or the ending could not tell)."""
        if self.started_ms is None or not self.created_ms:
            return None
        return max(self.started_ms - self.created_ms, 0) / 1000

    @property
    def run_s(self) -> float | None:
        """The job's start to its end (None: unknown)."""
        return None if self.started_ms is None else max(self.ended_ms - self.started_ms, 0) / 1000


def _int(value: str | None) -> int | None:
    return int(value) if value else None
