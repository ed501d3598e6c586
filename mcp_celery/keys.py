"""Every Redis key mcp-celery writes, in one place.

A task `abc` with the default prefix owns:

>>> k = Keys("mcp-celery")
>>> k.task("abc")
'mcp-celery:task:abc'
>>> k.answers("abc")
'mcp-celery:task:abc:answers'
>>> k.bell("abc")
'mcp-celery:task:abc:bell'

The task hash holds the record (tool, createdAt, TTL, client capabilities, owner, cancel
request, frozen terminal state) and one field per outstanding input request
(`in:<key>`), so that `tasks/get` is a single HGETALL beside the Celery result GET.
The answers hash keeps every delivered answer for replay after a redelivery; the bell
is a list used as a doorbell (BLPOP) that wakes a job waiting for input or cancel.
With `MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL` set, `owner:<principal>` is a sorted set of
the task ids that principal created, pruned of finished ones when counted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INPUT_FIELD_PREFIX", "Keys"]

#: Prefix of the task-hash fields that hold outstanding input requests.
INPUT_FIELD_PREFIX = "in:"


@dataclass(frozen=True)
class Keys:
    prefix: str = "mcp-celery"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def answers(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:answers"

    def bell(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:bell"

    def owner_tasks(self, principal: str) -> str:
        """Sorted set (score: creation ms) of a principal's task ids; kept only with a live-task quota."""
        return f"{self.prefix}:owner:{principal}"
