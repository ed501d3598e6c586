"""What the topology changes in the commands the store sends: the publish command, scripts on pipelines.

Tier 1 (redis-py). The scripts announce changes with PUBLISH; on a cluster store that becomes
SPUBLISH (sharded pub/sub, Redis 7: a message goes to the node holding the task's slot only), and
`publish_command` is the one place that decides (`scripts.publishing` applies it). Plain Redis,
6.2 included, keeps PUBLISH.

A script on a pipeline is queued as a plain EVALSHA (`queue_script`): redis-py refuses `evalsha` on
a cluster pipeline by name, and on one server it would ask SCRIPT EXISTS in a round trip of its own
before every pipeline. A node that lacks the script (restarted, or a replica just promoted) answers
NOSCRIPT, and `SyncPipelined`/`AsyncPipelined` load the scripts and run the pipeline once more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from mcp_celery.store.connect import AsyncRedis, SyncRedis

__all__ = ["AsyncPipelined", "SyncPipelined", "is_cluster", "publish_command", "queue_publish", "queue_script"]


def is_cluster(client: SyncRedis | AsyncRedis) -> bool:
    """Whether `client` talks to a Redis Cluster (its scripts may touch one slot only)."""
    return isinstance(client, redis.cluster.RedisCluster | aiocluster.RedisCluster)


def publish_command(client: SyncRedis | AsyncRedis) -> str:
    """The command the scripts announce changes with: SPUBLISH on a cluster (sharded, Redis 7), else PUBLISH."""
    return "SPUBLISH" if is_cluster(client) else "PUBLISH"


def queue_script(pipe: Any, script: Script | AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue `script` on a pipeline of either client kind; run the pipeline with `SyncPipelined`/`AsyncPipelined`."""
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


def queue_publish(pipe: Any, command: str, channel: str, message: str) -> None:
    """Queue a PUBLISH (or SPUBLISH) on a pipeline; redis-py refuses `publish` on a cluster pipeline by name."""
    pipe.execute_command(command, channel, message)


class SyncPipelined:
    """Runs pipelines that hold scripts, loading them on a node that lacks them (a new or failed-over primary)."""

    def __init__(self, client: SyncRedis, scripts: Sequence[Script]) -> None:
        self.client = client
        self.scripts = scripts

    def __call__(self, build: Callable[[Any], object]) -> list[Any]:
        """Build a pipeline with `build(pipe)` and run it; once more after loading the scripts on NOSCRIPT.

        Only for pipelines whose commands may run twice (every store pipeline's may).
        """
        for attempt in range(2):
            with self.client.pipeline(transaction=False) as pipe:
                build(pipe)
                try:
                    return list(pipe.execute())
                except NoScriptError:
                    if attempt:
                        raise
            for script in self.scripts:
                self.client.script_load(script.script)
        raise AssertionError("unreachable")


class AsyncPipelined:
    """`SyncPipelined` for asyncio clients."""

    def __init__(self, client: AsyncRedis, scripts: Sequence[AsyncScript]) -> None:
        self.client = client
        self.scripts = scripts

    async def __call__(self, build: Callable[[Any], object]) -> list[Any]:
        for attempt in range(2):
            async with self.client.pipeline(transaction=False) as pipe:
                build(pipe)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    if attempt:
                        raise
            for script in self.scripts:
                loaded: Awaitable[Any] = self.client.script_load(script.script)
                await loaded
        raise AssertionError("unreachable")
