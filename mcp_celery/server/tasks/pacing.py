"""How often a listen stream tells a client that a task's live output grew: at most 4 times a second.

Server tier, for `listen`. A job may call `ctx.output` thousands of times a second; each call pings
the task's channel, and a client that reads the output at every notification would read it as
often. So each URI's `notifications/resources/updated` goes out at once when its last one is older
than a quarter of a second (the first line after a pause arrives without delay), and otherwise once
the quarter is over, for every line that arrived meanwhile. A notification only says "read again":
one sent late for many lines loses nothing.
"""

from __future__ import annotations

__all__ = ["UPDATES_PER_S", "OutputPacer"]

#: Most `notifications/resources/updated` per second for one output URI on one stream.
UPDATES_PER_S = 4
_INTERVAL_S = 1 / UPDATES_PER_S


class OutputPacer:
    """The outputs one stream watches (task id -> URI): which grew since their last notification, and when
    each may be sent (times on anyio's clock)."""

    def __init__(self, uris: dict[str, str]) -> None:
        self.uris = uris
        self._sent_at: dict[str, float] = {}
        self._due: set[str] = set()

    @property
    def due(self) -> bool:
        """Whether an output grew that its client has not been told of yet."""
        return bool(self._due)

    def grew(self, task_ids: set[str]) -> None:
        self._due |= task_ids & self.uris.keys()

    def take(self, now: float) -> list[str]:
        """The URIs to notify now; each counts as sent at `now`."""
        ready = [task_id for task_id in sorted(self._due) if self._may_send_at(task_id) <= now]
        for task_id in ready:
            self._due.discard(task_id)
            self._sent_at[task_id] = now
        return [self.uris[task_id] for task_id in ready]

    def next_at(self) -> float | None:
        """When the next URI that is due may be sent; None when none is due."""
        return min((self._may_send_at(task_id) for task_id in self._due), default=None)

    def _may_send_at(self, task_id: str) -> float:
        sent = self._sent_at.get(task_id)
        return float("-inf") if sent is None else sent + _INTERVAL_S
