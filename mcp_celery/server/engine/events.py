"""The process's one Redis listener: which watched tasks changed, for listen streams and sync calls.

Server tier. Every state change of a task is PUBLISHed on one channel per task (`Keys.events`),
in the same Lua script or pipeline as the write itself: by the worker (started, progress,
questions, outcome) and by any server (answers, cancel, a frozen terminal state). So a server
hears about any task, whichever replica created it and whichever worker runs it, on one pub/sub
connection per process, subscribed to the channels of the tasks someone on this process is
watching, and only those.

On a cluster store the channels are sharded (SSUBSCRIBE; the scripts SPUBLISH, Redis 7): each
task's channel lives in its task's slot, so a change is sent to the node that holds the task and
to nobody else, and the listener holds one connection per node it listens on. redis-py's cluster
pub/sub reads its nodes in turn (so each read waits briefly, `SHARDED_READ_S`), and its turn
keeps a node whose last channel went: the listener then starts a fresh one (`_renew`).

A job's live output growing is announced on the same channel (`OUTPUT_EVENT`): it wakes only the
watchers of that output, which batch the notifications they send (`mcp_celery.server.tasks.listen`).

Pub/sub rather than streams: a message only says "look again", and the state itself is read
from the record (one round trip, exactly what `tasks/get` returns), so nothing needs replay: a
watcher subscribes first and then reads, and misses nothing. "First" means Redis confirmed the
subscription: a SUBSCRIBE sent but not yet processed loses a PUBLISH that another connection's
command (the watcher's own read, a worker's write) gets processed before it, so `watch` waits
for the confirmation, which the listener loop reads. A watch that ends leaves its channels to a
second loop, which UNSUBSCRIBEs them after the watcher's answer has gone out, several at once under
load; a channel watched again meanwhile stays. Streams would add per-task
history, memory and trimming that nobody reads. Pings are coalesced per watcher (a set of
changed ids), so a slow consumer costs no memory however fast a job reports progress.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from redis.exceptions import RedisError

from mcp_celery.store.connect import AsyncRedis
from mcp_celery.store.schema import OUTPUT_EVENT

__all__ = ["TaskEvents", "Watcher"]

logger = logging.getLogger(__name__)

_OUTPUT_EVENT = OUTPUT_EVENT.encode()
#: How long one read of a cluster node's sharded channels waits before the next node's turn.
SHARDED_READ_S = 0.05
#: The longest a new watch waits for Redis to confirm its subscriptions (then it goes on unconfirmed,
#: as on a connection being renewed, which marks every watcher changed once it is back).
CONFIRM_S = 1.0


class Watcher:
    """The ids of watched tasks that changed since the last `changed()`, and of those whose output grew."""

    def __init__(self, task_ids: Iterable[str], outputs: Iterable[str] = ()) -> None:
        self.states = frozenset(task_ids)
        self.outputs = frozenset(outputs)
        #: Every task this watcher listens to (a channel each).
        self.task_ids = self.states | self.outputs
        self._dirty: set[str] = set()
        self._grown: set[str] = set()
        self._event = anyio.Event()

    def mark(self, task_id: str) -> None:
        if task_id in self.states:
            self._dirty.add(task_id)
            self._event.set()

    def mark_output(self, task_id: str) -> None:
        """The task's live output grew: wakes only a watcher of its output (a state's watcher reads nothing)."""
        if task_id in self.outputs:
            self._grown.add(task_id)
            self._event.set()

    def grown(self) -> set[str]:
        """The watched outputs that grew since the last call."""
        grown, self._grown = self._grown, set()
        return grown

    async def changed(self, timeout: float | None = None) -> set[str]:
        """Wait until a watched task changes (or `timeout` seconds pass); returns the changed ids."""
        with anyio.move_on_after(timeout):
            await self._event.wait()
        dirty, self._dirty = self._dirty, set()
        self._event = anyio.Event()
        return dirty


class TaskEvents:
    """One pub/sub connection for the process; channels are subscribed while someone watches them."""

    def __init__(self, client: AsyncRedis, channel_of: Callable[[str], str], *, sharded: bool = False) -> None:
        self._client = client
        self._channel_of = channel_of
        self._sharded = sharded
        self._pubsub: Any = client.pubsub()
        self._watchers: dict[bytes, dict[Watcher, str]] = {}
        self._subscribed = anyio.Event()  # set once the listener has a channel to read
        # Subscription changes one at a time, each on the pub/sub current when its turn comes: one
        # started on a pub/sub that `_renew` closes meanwhile would hold a connection nobody reads.
        self._lock = anyio.Lock()
        self._stale = False  # the last renewal failed: the listener tries again
        # Per channel, the watches waiting for Redis to confirm a SUBSCRIBE of it, in the order sent.
        self._unconfirmed: dict[bytes, list[anyio.Event]] = {}
        # Channels whose last watch ended, for `_leave` to UNSUBSCRIBE (unless watched again by then).
        self._leaving: set[bytes] = set()
        self._left = anyio.Event()

    @property
    def channels(self) -> int:
        """How many task channels this process listens to now."""
        return len(self._watchers)

    @property
    def watchers(self) -> int:
        """How many watchers (listen streams, synchronous calls) are open now."""
        return len({watcher for watchers in self._watchers.values() for watcher in watchers})

    @asynccontextmanager
    async def watch(self, task_ids: Iterable[str], outputs: Iterable[str] = ()) -> AsyncIterator[Watcher]:
        """Listen for changes of `task_ids`, and for the growth of the live output of `outputs`, for the block."""
        watcher = Watcher(task_ids, outputs)
        new: list[bytes] = []
        for task_id in watcher.task_ids:
            channel = self._channel_of(task_id).encode()
            if channel not in self._watchers:
                self._watchers[channel] = {}
                new.append(channel)
            self._watchers[channel][watcher] = task_id
        pending = [(channel, self._expect_confirmation(channel)) for channel in new]
        try:
            if new:
                await self._subscribe(new)
                self._subscribed.set()
                with anyio.move_on_after(CONFIRM_S):
                    for _, confirmed in pending:
                        await confirmed.wait()
            yield watcher
        finally:
            self._forget_unconfirmed(pending)
            self._unwatch(watcher)

    async def run(self) -> None:
        """The listener loop and the loop that leaves channels; run in the server's lifespan until cancelled."""
        async with anyio.create_task_group() as loops:
            loops.start_soon(self._leave)
            await self._listen()

    async def _listen(self) -> None:
        while True:
            await self._subscribed.wait()
            if self._stale:
                await anyio.sleep(0.5)
                await self._renew()
                continue
            try:
                message = await self._next_message()
            except (RedisError, OSError):
                logger.warning("task event listener lost its Redis connection; resubscribing", exc_info=True)
                await anyio.sleep(0.5)
                await self._renew()
                continue
            except RuntimeError:
                if not self._sharded:
                    raise
                await self._renew()  # the cluster pub/sub's turn reached a node it had let go
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        """A change wakes the watchers of its task; a subscription's confirmation, the watch awaiting it."""
        kind = message.get("type")
        if kind in ("message", "smessage"):
            output = bytes(message["data"]) == _OUTPUT_EVENT
            for watcher, task_id in list(self._watchers.get(bytes(message["channel"]), {}).items()):
                (watcher.mark_output if output else watcher.mark)(task_id)
        elif kind in ("subscribe", "ssubscribe"):
            self._confirm(bytes(message["channel"]))

    def _expect_confirmation(self, channel: bytes) -> anyio.Event:
        confirmed = anyio.Event()
        self._unconfirmed.setdefault(channel, []).append(confirmed)
        return confirmed

    def _confirm(self, channel: bytes) -> None:
        """Redis confirmed a SUBSCRIBE of `channel`: the watch waiting longest for one goes on."""
        waiting = self._unconfirmed.get(channel)
        if waiting:
            waiting.pop(0).set()
            if not waiting:
                del self._unconfirmed[channel]

    def _forget_unconfirmed(self, pending: list[tuple[bytes, anyio.Event]]) -> None:
        """Drop this watch's confirmations still awaited, so that a later watch's are not taken for them."""
        for channel, confirmed in pending:
            waiting = self._unconfirmed.get(channel, [])
            if confirmed in waiting:
                waiting.remove(confirmed)
                if not waiting:
                    del self._unconfirmed[channel]

    async def aclose(self) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    def _unwatch(self, watcher: Watcher) -> None:
        """Forget `watcher`; the channels nobody watches now are left to `_leave`."""
        for task_id in watcher.task_ids:
            channel = self._channel_of(task_id).encode()
            watchers = self._watchers.get(channel)
            if watchers is not None:
                watchers.pop(watcher, None)
                if not watchers:
                    del self._watchers[channel]
                    self._leaving.add(channel)
                    self._left.set()

    async def _leave(self) -> None:
        """UNSUBSCRIBE the channels whose watches ended, off the watchers' path (their answers go first)."""
        while True:
            await self._left.wait()
            self._left = anyio.Event()
            async with self._lock:
                # Under the lock, after any SUBSCRIBE sent before: a channel watched again stays.
                gone = [channel for channel in self._leaving if channel not in self._watchers]
                self._leaving.clear()
                if not gone:
                    continue
                try:
                    await (self._pubsub.sunsubscribe(*gone) if self._sharded else self._pubsub.unsubscribe(*gone))
                except (RedisError, OSError):
                    # The listener loop renews the connection, which subscribes the watched channels only.
                    logger.warning("could not unsubscribe from %d task channels", len(gone), exc_info=True)

    async def _subscribe(self, channels: list[bytes]) -> None:
        """Subscribe, or failing that renew the connection (which subscribes every watched channel)."""
        async with self._lock:
            try:
                await self._subscribe_current(channels)
                return
            except (RedisError, OSError):
                # Not the caller's failure: a watch goes on, and learns of every change once renewed.
                logger.warning("could not subscribe to %d task channels; renewing", len(channels), exc_info=True)
        await self._renew()

    async def _subscribe_current(self, channels: list[bytes]) -> None:
        """SUBSCRIBE (SSUBSCRIBE on a cluster) on the current pub/sub; the caller holds the lock."""
        await (self._pubsub.ssubscribe(*channels) if self._sharded else self._pubsub.subscribe(*channels))

    async def _next_message(self) -> dict[str, Any] | None:
        if self._sharded:
            if not self._watchers:
                # Only this loop renews an idle cluster pub/sub: closing one while it reads here would
                # read as a lost connection (and half a second of deafness for the next watch).
                self._subscribed = anyio.Event()  # nothing to read until the next watch
                await self._renew()  # a fresh cluster pub/sub, holding no connection, for the next watch
                return None
            message: dict[str, Any] | None = await self._pubsub.get_sharded_message(timeout=SHARDED_READ_S)
            return message
        return await self._pubsub.get_message(timeout=1.0)  # type: ignore[no-any-return]

    async def _renew(self) -> None:
        """A new connection, every watched channel again, and a look at every watched task (pings were lost)."""
        async with self._lock:
            try:
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
                self._pubsub = self._client.pubsub()
                self._leaving.clear()  # the new connection holds only the channels watched now
                if self._watchers:
                    await self._subscribe_current(list(self._watchers))
            except (RedisError, OSError):
                logger.warning("task event listener could not resubscribe", exc_info=True)
                self._stale = True
                return
            self._stale = False
        for watchers in list(self._watchers.values()):
            for watcher, task_id in list(watchers.items()):
                watcher.mark(task_id)
                watcher.mark_output(task_id)
