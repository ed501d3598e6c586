"""`JobContext.output`: a job's live output, the lines it prints as it runs (`mcp_celery.store.output`).

Worker tier. Each call is one round trip (`scripts.OUTPUT_APPEND`): the text is appended to the
task's output resource, `mcp-celery://tasks/{taskId}/output`, whose last MCP_CELERY_OUTPUT_KEEP_BYTES
are kept, and the task's listeners are told on its event channel, where servers batch the
`notifications/resources/updated` they send (`mcp_celery.server.tasks.listen`). A workflow member
writes to its MCP task's output: the task the client holds. Best effort, as `status()`: while Redis
is unreachable the job goes on and that text is lost.
"""

from __future__ import annotations

import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from mcp_celery.store.sync import SyncStore

__all__ = ["OutputSink", "write_output"]

logger = logging.getLogger(__name__)


class OutputSink:
    """Where one job's live output goes: its MCP task's output in the store, `keep` bytes of it kept."""

    def __init__(self, store: SyncStore, task_id: str, keep: int) -> None:
        self._store = store
        self._task_id = task_id
        self._keep = keep
        #: Whether this run wrote output (its end expires the output with the record).
        self.wrote = False

    def write(self, text: str) -> None:
        try:
            self._store.append_output(self._task_id, text.encode(), self._keep)
        except (RedisConnectionError, RedisTimeoutError):
            logger.warning("task %s: Redis unreachable; this output is lost", self._task_id)
        self.wrote = True


def write_output(sink: OutputSink | None, task_id: str, text: str) -> None:
    """`text` to the task's output; a job run outside MCP (no sink) logs it instead, so it is not lost."""
    if sink is None:
        logger.info("task %s output: %s", task_id, text.rstrip("\n"))
    else:
        sink.write(text)
