"""Acknowledged means replicated, when asked: the WAIT that both sides of the store add to a write.

With `Durability.min_replicas`, a write that must outlive a failover runs in one pipeline with a WAIT
for that many replicas (bounded by `Durability.wait_ms`): on the same connection, since WAIT counts
that connection's writes and everything the primary wrote before them. Fewer in time raise
`NotReplicated`. The server waits so for what it acknowledges (a task's creation, an answer, a
cancel); the worker for what a job decides on them (its question, giving up on it, its outcome), so
that a decision taken on a primary that a failover then drops is taken again on the new one.
"""

from __future__ import annotations

from typing import Any

from mcp_celery.errors import NotReplicated
from mcp_celery.store.schema import Durability

__all__ = ["NotOnPrimary", "NotReplicated", "check_replicas", "queue_wait"]


class NotOnPrimary(NotReplicated):
    """The write is not on the primary the WAIT's connection reached: in a failover under load, one
    connection can be on a primary that Sentinel replaced while another is on the new one."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not on the Redis primary reached now (a failover is under way)")


def queue_wait(pipe: Any, durability: Durability) -> None:
    """Add the WAIT to a pipeline, after its writes."""
    pipe.execute_command("WAIT", durability.min_replicas, durability.wait_ms)


def check_replicas(what: str, confirmed: Any, durability: Durability) -> None:
    """Raise `NotReplicated` unless the WAIT's reply counts enough replicas."""
    if int(confirmed) < durability.min_replicas:
        raise NotReplicated(
            f"{what} reached the Redis primary, but {int(confirmed)} of the {durability.min_replicas} replicas it "
            f"must reach confirmed it within {durability.wait_ms} ms (MCP_CELERY_REDIS_MIN_REPLICAS)"
        )
