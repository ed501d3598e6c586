"""What a server can see of a Redis broker: where a task's message is, and putting a lost job's back.

Server tier. Kombu's Redis transport keeps each queue as a list (one per priority step, named
`queue`, `queue\\x06\\x163`, ...), pops messages with BRPOP, and then (not atomically: a worker
killed in between loses the message) copies each delivered message into the hash `unacked`
(delivery tag -> JSON `[payload, exchange, routing key]`) and the sorted set `unacked_index`
(delivery tag -> delivery time, s), until the worker acks it. A message neither in its queue
nor in `unacked` is gone: no worker has it, or will ever run it. A message in `unacked` whose
worker died stays there until kombu's visibility timeout (hours, longer than any job).

Every key here is kombu's (checked against kombu 5.x `transport/redis.py`: `Channel.unacked_key`,
`unacked_index_key`, `sep`, `priority_steps`, `global_keyprefix`, `_q_for_pri`,
`_do_restore_message`); a message names its task in `headers.id` (Celery's protocol 2).
RabbitMQ cannot be looked into like this, and needs it less: it redelivers the unacked
messages of a closed channel by itself.
"""

from __future__ import annotations

import json
from bisect import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS
from kombu.utils.json import dumps as kombu_dumps

from mcp_celery.core.binding import broker_url, queues_readable
from mcp_celery.store.connect import AsyncRedis, RedisTarget, async_client, redis_target
from mcp_celery.store.schema import as_text

__all__ = ["DELIVERED", "NOWHERE", "QUEUED", "STALE", "RedisBroker", "Whereabouts", "broker_target"]

NOWHERE, QUEUED, DELIVERED, STALE = 0, 1, 2, 3

# KEYS[1] unacked hash, KEYS[2] unacked index, then the queue's lists (one per priority step).
# ARGV: pairs of task id and "stale before" (s; 0: never stale).
# Returns, in ARGV order, {where, tag, entry}: NOWHERE (0), QUEUED (1), DELIVERED (2: a worker
# holds it) or STALE (3: delivered before its "stale before" time, so its worker is gone; the
# tag and the unacked entry come with it, for REQUEUE).
# A message names its task as `"id": "<id>"` (kombu's JSON; `"root_id"` and the like never match,
# nor do arguments: base64 in the body, quoted with \" in kwargsrepr), found by plain search, the
# cheapest Lua has. Each list is read from its right end, where BRPOP takes the oldest messages,
# 500 at a time, and the reading stops once every id is found: the ids asked about are of tasks
# queued the longest, so a healthy queue is read only as deep as they sit. An id found nowhere
# costs one whole pass over the queue (about 0.2 s for 10,000 messages of 1.3 kB). Each message's
# ids are matched against a table, so the cost does not grow with the number of ids asked about.
# The unacked hash (a few entries per worker process: no prefetch) is read only for ids not
# found in the queue.
WHEREABOUTS = """
local want, where, tag, entry, missing = {}, {}, {}, {}, 0
for i = 1, #ARGV, 2 do want[ARGV[i]] = tonumber(ARGV[i + 1]); missing = missing + 1 end
local function ids(message)
  local at = 1
  return function()
    local found = string.find(message, '"id": "', at, true)
    if not found then return nil end
    local stop = string.find(message, '"', found + 7, true) or #message + 1
    at = stop
    return string.sub(message, found + 7, stop - 1)
  end
end
for k = 3, #KEYS do
  local stop = redis.call('LLEN', KEYS[k])
  while missing > 0 and stop > 0 do
    local start = math.max(stop - 500, 0)
    for _, message in ipairs(redis.call('LRANGE', KEYS[k], start, stop - 1)) do
      for id in ids(message) do
        if want[id] and not where[id] then where[id] = 1; missing = missing - 1 end
      end
    end
    stop = start
  end
end
if missing > 0 then
  local unacked = redis.call('HGETALL', KEYS[1])
  for j = 1, #unacked, 2 do
    for id in ids(unacked[j + 1]) do
      local stale = want[id]
      if stale and where[id] ~= 1 then
        local at = tonumber(redis.call('ZSCORE', KEYS[2], unacked[j]) or '0')
        if stale > 0 and at < stale then
          where[id], tag[id], entry[id] = 3, unacked[j], unacked[j + 1]
        elseif where[id] ~= 3 then
          where[id] = 2
        end
      end
    end
  end
end
local out = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  out[#out + 1] = {where[id] or 0, tag[id] or '', entry[id] or ''}
end
return out
"""

# KEYS[1] unacked hash, KEYS[2] unacked index, KEYS[3] the queue list. ARGV[1] delivery tag,
# ARGV[2] the unacked entry as WHEREABOUTS saw it, ARGV[3] the message to queue again.
# Moves the message back to the head of its queue (what kombu's own restore does) only if the
# entry is unchanged: a worker that acked it meanwhile, or another server that moved it first,
# wins, so one lost job is re-queued once however many servers look. Returns 1 when moved.
REQUEUE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Whereabouts:
    """Where one task's message is; `tag` and `entry` only for a STALE one."""

    where: int
    tag: str = ""
    entry: str = ""


def broker_target(app: Celery) -> RedisTarget | None:
    """The app's Redis broker as a connection target (one server, TLS or Sentinel's master); None for
    RabbitMQ and the rest.

    Raises:
        ConfigurationError: a Redis broker URL that cannot work.
    """
    if not queues_readable(app):
        return None
    url = broker_url(app)
    if url.startswith("sentinel://"):
        options = app.conf.broker_transport_options or {}
        return redis_target(
            url,
            master_name=options.get("master_name"),
            sentinel_kwargs=options.get("sentinel_kwargs"),
            setting="the Celery broker",
        )
    return redis_target(url.split(";")[0].strip(), setting="the Celery broker")  # failover lists: the first


class RedisBroker:
    """A Celery app's Redis broker, as kombu lays it out."""

    def __init__(self, client: AsyncRedis, options: Mapping[str, Any]) -> None:
        self.redis = client
        self.prefix = str(options.get("global_keyprefix", ""))
        self.sep = str(options.get("sep", "\x06\x16"))
        self.steps = list(options.get("priority_steps", PRIORITY_STEPS))
        self.unacked = self.prefix + str(options.get("unacked_key", "unacked"))
        self.unacked_index = self.prefix + str(options.get("unacked_index_key", "unacked_index"))
        self._whereabouts = client.register_script(WHEREABOUTS)
        self._requeue = client.register_script(REQUEUE)

    @classmethod
    def of_app(cls, app: Celery) -> RedisBroker | None:
        """The app's broker when it is Redis: one server, TLS or Sentinel's master (None for RabbitMQ and the rest).

        Raises:
            ConfigurationError: a Redis broker URL that cannot work.
        """
        target = broker_target(app)
        if target is None:
            return None
        options = app.conf.broker_transport_options or {}
        return cls(async_client(target, client_name="mcp-celery-server-broker"), options)

    def queue_key(self, queue: str, priority: Any = None) -> str:
        """The list holding `queue`'s messages of `priority` (kombu's `_q_for_pri`)."""
        try:
            level = max(min(int(priority), 9), 0)
        except (TypeError, ValueError):
            level = 0
        step = self.steps[bisect(self.steps, level) - 1]
        return f"{self.prefix}{queue}{self.sep}{step}" if step else f"{self.prefix}{queue}"

    async def whereabouts(self, queue: str, stale_before: Mapping[str, float]) -> dict[str, Whereabouts]:
        """Where each task's message is, looking in `queue` and in the unacked hash (one script)."""
        ids = list(stale_before)
        keys = [self.unacked, self.unacked_index, *(self.queue_key(queue, step) for step in self.steps)]
        args = [part for task_id in ids for part in (task_id, repr(stale_before[task_id]))]
        replies: Sequence[Sequence[Any]] = await self._whereabouts(keys=keys, args=args)
        return {
            task_id: Whereabouts(int(reply[0]), as_text(reply[1]), as_text(reply[2]))
            for task_id, reply in zip(ids, replies, strict=True)
        }

    async def requeue(self, queue: str, found: Whereabouts) -> bool:
        """Put a STALE message back at the head of `queue`, flagged redelivered as kombu does."""
        payload = json.loads(found.entry)[0]
        payload.setdefault("headers", {})["redelivered"] = True
        payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
        key = self.queue_key(queue, payload["properties"].get("priority"))
        keys = [self.unacked, self.unacked_index, key]
        return bool(await self._requeue(keys=keys, args=[found.tag, found.entry, kombu_dumps(payload)]))

    async def aclose(self) -> None:
        await self.redis.aclose()
