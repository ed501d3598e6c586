"""A call the approval policy holds: what its record holds beyond a new task's, and the page's index entry.

Pure (no I/O). `AsyncStore.create` writes a held task with these commands in its round trip
(`held_commands`): the approval's input request open (`in:KEY`), so the task reads `input_required`
at once; `PARKED`, when the approval times out (the reaper ends the task then); `RESUME`, the job's
message as a Celery signature, which nothing sends until the ANSWER script hands it to the one answer
that closes the request (two approvals racing, on one server or two, get it once between them);
`GATE`, what the approval is bound to; the record's lifetime stretched over the approval window; the
approval page's index entry, as a job's own approval writes it (`SyncStore.register_approval`); and
a PUBLISH on the task's channel, so that a watcher (a plain call in its inline window) sees the
question at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, Keys

__all__ = ["Held", "held_commands"]


@dataclass(frozen=True)
class Held:
    """One held call: its task, its approval request and page id, and its job's message not yet sent."""

    task_id: str
    #: The input request's key (`in:KEY`) and the request itself (`mcp_celery.core.approvals.approval_request`).
    key: str
    request: dict[str, Any]
    approval_id: str
    asked_ms: int
    #: When the approval times out (ms).
    until_ms: int
    #: The job's message (kombu JSON of a Celery signature), sent once approved.
    signature: str
    #: What the approval is bound to (`FIELD.GATE`).
    gate: dict[str, Any]

    def fields(self) -> dict[str, str]:
        """The record's fields beyond a new task's."""
        return {
            INPUT_FIELD_PREFIX + self.key: json.dumps(self.request),
            FIELD.PARKED: str(self.until_ms),
            FIELD.RESUME: self.signature,
            FIELD.GATE: json.dumps(self.gate),
        }


def held_commands(
    keys: Keys, publish: str, held: Held, *, record_s: int, index_s: int
) -> list[tuple[str, tuple[Any, ...]]]:
    """The commands, after the new record's own, that make it a held task (`AsyncStore.create`'s `then`).

    `publish`: PUBLISH or SPUBLISH (`mcp_celery.store.commands.publish_command`); `record_s`: the
    record's lifetime (the approval window and a live task's lifetime after it); `index_s`: how long
    the page finds the approval by its id.
    """
    task = keys.task(held.task_id)
    where = json.dumps({"task": held.task_id, "key": held.key, "request": held.request})
    commands: list[tuple[str, tuple[Any, ...]]] = [
        ("hset", (task, name, value)) for name, value in held.fields().items()
    ]
    commands += [
        ("expire", (task, record_s)),
        ("set", (keys.approval(held.approval_id), where, index_s)),
        ("zadd", (keys.approvals(), {held.approval_id: held.asked_ms})),
        ("execute_command", (publish, keys.events(held.task_id), "inputs")),
    ]
    return commands
