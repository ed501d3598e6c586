"""The worker's store for a task's live output (`mcp_celery.store.output`): one script per append.

Tier 1, a part of `SyncStore`.
"""

from __future__ import annotations

from redis.commands.core import Script

from mcp_celery.store import scripts
from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.output import clip, slack
from mcp_celery.store.schema import Keys

__all__ = ["OutputWrites"]


class OutputWrites:
    """The output methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys
    _publish: str
    _output_append: Script | None = None

    def append_output(self, task_id: str, data: bytes, keep: int) -> bool:
        """Append `data` to the task's output, keeping its last `keep` bytes, in one round trip; listeners are
        told. False: the record is gone (the task expired), nothing was written."""
        if self._output_append is None:
            self._output_append = self.redis.register_script(scripts.publishing(scripts.OUTPUT_APPEND, self._publish))
        data, dropped = clip(data, keep)  # a text longer than what is kept is not sent whole
        keys = [self.keys.task(task_id), self.keys.output(task_id), self.keys.events(task_id)]
        return bool(self._output_append(keys=keys, args=[data, keep, slack(keep), dropped]))
