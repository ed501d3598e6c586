"""The server's event listener (`mcp_celery.server.engine.events`) under watch churn, on one Redis and on a cluster.

Every synchronous call and every `task_status` wait opens a watch and closes it: a listener that
loses its connection to that churn, loses a subscription, or lets a watch fail, turns into late
answers or an internal error on the request. Here watchers come and go while each one's task changes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp_celery.server.engine.events import TaskEvents
from mcp_celery.store.connect import AsyncRedis, async_client, redis_target
from mcp_celery.store.schema import Keys
from tests.support.harness import session_redis
from tests.support.redis_topologies import start_cluster

ROUNDS = 25


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = start_cluster(Path(tmp_path_factory.mktemp("events-cluster")))
    yield cluster.url
    cluster.stop()


async def _churn(client: AsyncRedis, sharded: bool, watchers: int) -> None:
    keys = Keys(prefix=f"events-{uuid.uuid4().hex[:8]}")
    events = TaskEvents(client, keys.events, sharded=sharded)
    publish = client.spublish if sharded else client.publish

    async def watcher(index: int) -> None:
        for round_ in range(ROUNDS):
            task_id = f"w{index}-r{round_}"
            async with events.watch([task_id]) as watched:
                await publish(keys.events(task_id), "changed")
                with anyio.fail_after(10):
                    assert task_id in await watched.changed(), "a change made under a watch reached it"

    await client.ping()  # a cluster client learns the slots before its pub/sub subscribes
    async with anyio.create_task_group() as listener:
        listener.start_soon(events.run)
        async with anyio.create_task_group() as group:
            for index in range(watchers):
                group.start_soon(watcher, index)
        assert events.channels == 0 and events.watchers == 0
        listener.cancel_scope.cancel()
    await events.aclose()
    await client.aclose()


@pytest.mark.parametrize("watchers", [1, 12], ids=["one-at-a-time", "many-at-once"])
@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_watches_that_come_and_go_hear_their_changes_and_never_cost_the_connection(
    topology: str, watchers: int, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """One watcher at a time leaves the listener with no channel after each round (a cluster's pub/sub
    is then renewed); many at once subscribe and unsubscribe on one connection concurrently."""
    url = request.getfixturevalue("cluster_url") if topology == "cluster" else session_redis(13)
    target = redis_target(url)
    caplog.set_level(logging.WARNING, logger="mcp_celery.server.engine.events")
    anyio.run(_churn, async_client(target), target.sharded, watchers)
    assert [record.getMessage() for record in caplog.records] == [], "no lost connection, no failed subscription"


async def _watch_again(client: AsyncRedis, rounds: int) -> None:
    keys = Keys(prefix=f"events-{uuid.uuid4().hex[:8]}")
    events = TaskEvents(client, keys.events)
    channel = keys.events("again")

    async def subscribers() -> int:
        return int(dict(await client.pubsub_numsub(channel))[channel.encode()])

    async with anyio.create_task_group() as listener:
        listener.start_soon(events.run)
        for _ in range(rounds):
            async with events.watch(["again"]):
                pass  # its UNSUBSCRIBE is left to the leaving loop, which may not have sent it yet
            async with events.watch(["again"]) as watched:
                await client.publish(channel, "changed")
                with anyio.fail_after(10):
                    assert "again" in await watched.changed(), "a watch that began as the last one ended heard"
        with anyio.fail_after(10):
            while await subscribers():
                await anyio.sleep(0.01)
        assert events.channels == 0
        listener.cancel_scope.cancel()
    await events.aclose()
    await client.aclose()


def test_a_channel_watched_again_as_its_last_watch_ends_stays_subscribed_and_is_left_once_unwatched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Watches end without waiting for their UNSUBSCRIBE (it is sent after their answer): one that
    begins before it was sent keeps hearing its task, and once nobody watches, Redis holds no subscriber."""
    caplog.set_level(logging.WARNING, logger="mcp_celery.server.engine.events")
    anyio.run(_watch_again, async_client(redis_target(session_redis(13))), ROUNDS)
    assert [record.getMessage() for record in caplog.records] == [], "no lost connection, no failed subscription"
