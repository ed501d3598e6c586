"""The task record: what mcp-celery keeps in Redis for each task, and its codec.

Pure (no I/O), shared by the worker and the server. Celery's own result meta says how
the job is doing; the record says what Celery cannot: that the task exists at all (a
queued and an unknown id both read PENDING in Celery), when it was created, its TTL, the
client's capabilities, its owner, a cancel request, outstanding input requests, and,
once a terminal state has been observed, that state frozen so it never changes again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_celery.keys import INPUT_FIELD_PREFIX

__all__ = ["TaskRecord", "as_text", "decode_hash"]


@dataclass(frozen=True)
class TaskRecord:
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
    inputs: dict[str, Any] = field(default_factory=lambda: {})
    first_answers: dict[str, Any] = field(default_factory=lambda: {})

    def to_hash(self) -> dict[str, str]:
        """Fields written when the task is created (the rest are written as it runs)."""
        fields = {
            "tool": self.tool,
            "created": str(self.created_ms),
            "ttl": "" if self.ttl_ms is None else str(self.ttl_ms),
            "poll": str(self.poll_ms),
            "caps": json.dumps(self.capabilities),
            "owner": self.owner,
            "sync": "1" if self.sync else "",
        }
        if self.first_answers:
            fields["first"] = json.dumps(self.first_answers)
        return fields

    @classmethod
    def from_hash(cls, task_id: str, raw: Mapping[str, str]) -> TaskRecord | None:
        """Decode an HGETALL reply; None when the record is missing or incomplete."""
        if "tool" not in raw or "created" not in raw:
            return None
        inputs = {
            k[len(INPUT_FIELD_PREFIX) :]: json.loads(v) for k, v in raw.items() if k.startswith(INPUT_FIELD_PREFIX)
        }
        return cls(
            task_id=task_id,
            tool=raw["tool"],
            created_ms=int(raw["created"]),
            ttl_ms=int(raw["ttl"]) if raw.get("ttl") else None,
            poll_ms=int(raw.get("poll") or 1000),
            capabilities=json.loads(raw.get("caps") or "{}"),
            owner=raw.get("owner", ""),
            sync=bool(raw.get("sync")),
            cancel_ms=int(raw["cancel"]) if raw.get("cancel") else None,
            updated_ms=int(raw["updated"]) if raw.get("updated") else None,
            final=json.loads(raw["final"]) if raw.get("final") else None,
            inputs=inputs,
            first_answers=json.loads(raw["first"]) if raw.get("first") else {},
        )


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in raw.items()}


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
