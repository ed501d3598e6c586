"""The worker's store for workflows (`mcp_celery.core.workflows`): the members' records, the hand-over, the merge.

Tier 1, a part of `SyncStore` (which registers the scripts and runs the pipelines): what a worker
writes when a job hands its task over to a workflow (`mcp_celery.worker.workflow`) and when a
member ends and the workflow takes a step. A member's keys share its MCP task's hash tag
(`schema.member_id`), so the scripts that change a member and announce on the MCP task's channel
stay in one slot of a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.commands.core import Script

from mcp_celery.protocol import now_ms
from mcp_celery.store.commands import SyncPipelined, queue_script
from mcp_celery.store.connect import SyncRedis
from mcp_celery.store.schema import FIELD, Keys, Lifetimes, TaskRecord, as_text, decode_hash

__all__ = ["MemberRecords"]


class MemberRecords:
    """The workflow methods of `SyncStore`."""

    redis: SyncRedis
    keys: Keys
    lifetimes: Lifetimes
    _pipelined: SyncPipelined
    _launch: Script
    _freeze: Script
    _cancel: Script
    _progress: Script

    def create_members(self, parent: TaskRecord, members: Sequence[tuple[str, str]], check_at_ms: int | None) -> None:
        """The records of a workflow's members (`(task id, Celery task name)` each): the parent's owner,
        capabilities and lifetimes, and the parent's id; watched like any new task (`check_at_ms`)."""

        def build(pipe: Any) -> None:
            for member_id, name in members:
                record = replace(parent, task_id=member_id, tool=name, created_ms=now_ms(), parent=parent.task_id)
                key = self.keys.task(member_id)
                pipe.hset(key, mapping=record.to_hash())
                pipe.expire(key, self.lifetimes.live_s)
                if check_at_ms is not None:
                    pipe.zadd(self.keys.live(), {member_id: check_at_ms})

        self._pipelined(build)

    def launch(self, task_id: str, workflow_json: str) -> bool:
        """Hand the task over to its workflow; False when it was cancelled or ended meanwhile (LAUNCH)."""
        return bool(self._launch(keys=[self.keys.task(task_id), self.keys.events(task_id)], args=[workflow_json]))

    def handed_over(self, task_id: str, message: str) -> None:
        """The job that made the workflow ended: its heartbeat's entry goes; the record lives on with the workflow."""
        meta = json.dumps({"status": "PROGRESS", "result": {"message": message}})

        def build(pipe: Any) -> None:
            queue_script(pipe, self._progress, [self.keys.task(task_id), self.keys.events(task_id)], [meta, now_ms()])
            pipe.zrem(self.keys.live(), task_id)

        self._pipelined(build)

    def read_records(self, task_ids: Sequence[str]) -> list[TaskRecord | None]:
        """Several records in one round trip (a workflow and its members)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hgetall(self.keys.task(task_id))
            raws = pipe.execute()
        return [TaskRecord.from_hash(t, decode_hash(raw)) for t, raw in zip(task_ids, raws, strict=True)]

    def watch_sent(self, task_id: str, check_at_ms: int) -> None:
        """Look for this member's message at `check_at_ms` unless its job started by then (a merge step or
        a chain's next step, sent when its turn comes); an entry its start or its end made stays."""
        self.redis.zadd(self.keys.live(), {task_id: check_at_ms}, nx=True)

    def claim_merge(self, task_id: str) -> bool:
        """True for the one caller that launches the workflow's merge step."""
        return bool(self.redis.hsetnx(self.keys.task(task_id), FIELD.MERGING, now_ms()))

    def freeze(self, task_id: str, frozen: str) -> None:
        """Freeze the task's end (FREEZE: the first one stays) and tell its listeners."""
        self._freeze(keys=[self.keys.task(task_id), self.keys.events(task_id)], args=[frozen])

    def cancel_members(
        self, task_ids: Sequence[str], channel: str, cancelled_before_start: str, cancelled_while_parked: str
    ) -> list[str]:
        """Cancel these members (CANCEL each, in one round trip): one not started yet or parked at once, the
        others by flag. Returns the parked ones (no worker runs them to tell Celery's backend).

        A member cancelled at once leaves `live` after the script (see `Keys.live`).
        """
        ttl_s = self.lifetimes.ttl_s
        args: list[str | int] = [now_ms(), self.lifetimes.live_s, cancelled_before_start, cancelled_while_parked]
        args.append(ttl_s or "")

        def build(pipe: Any) -> None:
            for task_id in task_ids:
                keys = [self.keys.task(task_id), self.keys.bell(task_id), self.keys.events(channel)]
                queue_script(pipe, self._cancel, keys, args)

        outcomes = self._pipelined(build) if task_ids else []
        found = {t: as_text(outcome) for t, outcome in zip(task_ids, outcomes, strict=True) if outcome}
        frozen = [t for t, outcome in found.items() if outcome in ("unstarted", "parked")]
        if frozen:
            self.redis.zrem(self.keys.live(), *frozen)
        return [t for t, outcome in found.items() if outcome == "parked"]
