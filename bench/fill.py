"""Bulk-fill Redis with synthetic task records cloned from one real task.

How: scan every Redis db for keys whose *name* contains the real task's id (per-task keys) and for
hash/set/zset keys whose *members* contain it (index keys). Each is turned into a template with the id
replaced by a placeholder, then a server-side Lua loop (EVAL, 20,000 ids per call) writes the same
records for synthetic ids (the real id with its last 12 characters replaced by a hex counter), with
the same types, values (id substituted) and TTLs. Keys unrelated to the task (queues, bindings,
worker bookkeeping) are not cloned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

PH = b"\x00ID\x00"

LUA = r"""
local start = tonumber(ARGV[1]); local n = tonumber(ARGV[2]); local prefix = ARGV[3]
local nspec = tonumber(ARGV[4]); local del = ARGV[5] == 'del'
local function sub(s, id)
  local out, i = {}, 1
  while true do
    local a, b = string.find(s, '\0ID\0', i, true)
    if not a then out[#out + 1] = string.sub(s, i); break end
    out[#out + 1] = string.sub(s, i, a - 1); out[#out + 1] = id; i = b + 1
  end
  return table.concat(out)
end
for k = start, start + n - 1 do
  local id = prefix .. string.format('%012x', k)
  local p = 6
  for s = 1, nspec do
    local kind = ARGV[p]; local key = sub(ARGV[p + 1], id); local pttl = tonumber(ARGV[p + 2])
    local nitems = tonumber(ARGV[p + 3]); local index = ARGV[p + 4] == '1'; p = p + 5
    if del then
      local width = (kind == 'hash' or kind == 'zset') and 2 or 1
      if not index then
        redis.call('DEL', key)
      else
        for j = 0, nitems - 1 do
          local m = sub(ARGV[p + width * j], id)
          if kind == 'hash' then redis.call('HDEL', key, m)
          elseif kind == 'zset' then redis.call('ZREM', key, m)
          else redis.call('SREM', key, m) end
        end
      end
      p = p + width * nitems
    elseif kind == 'string' then
      redis.call('SET', key, sub(ARGV[p], id)); p = p + 1
    elseif kind == 'hash' then
      local args = {}
      for j = 0, nitems - 1 do
        args[#args + 1] = sub(ARGV[p + 2 * j], id); args[#args + 1] = sub(ARGV[p + 2 * j + 1], id)
      end
      redis.call('HSET', key, unpack(args)); p = p + 2 * nitems
    elseif kind == 'set' then
      local args = {}
      for j = 0, nitems - 1 do args[#args + 1] = sub(ARGV[p + j], id) end
      redis.call('SADD', key, unpack(args)); p = p + nitems
    elseif kind == 'zset' then
      local args = {}
      for j = 0, nitems - 1 do args[#args + 1] = ARGV[p + 2 * j + 1]; args[#args + 1] = sub(ARGV[p + 2 * j], id) end
      redis.call('ZADD', key, unpack(args)); p = p + 2 * nitems
    elseif kind == 'list' then
      local args = {}
      for j = 0, nitems - 1 do args[#args + 1] = sub(ARGV[p + j], id) end
      redis.call('RPUSH', key, unpack(args)); p = p + nitems
    end
    if pttl > 0 and not del then redis.call('PEXPIRE', key, pttl) end
  end
end
return n
"""


@dataclass
class Template:
    db: int
    kind: str
    key: bytes
    pttl: int
    items: list[bytes] = field(default_factory=list)
    index: bool = False  # an index key: only the members that mention the id are added

    def describe(self, tid: bytes) -> str:
        k = self.key.replace(PH, b"<id>").decode(errors="replace")
        what = "index entry in" if self.index else "per-task"
        ttl = f"TTL {self.pttl // 1000}s" if self.pttl > 0 else "no TTL"
        return f"db{self.db} {what} {self.kind} `{k}` ({len(self.items)} items, {ttl})"


def _dbs(r: redis.Redis) -> list[int]:
    return sorted(int(k[2:]) for k in r.info("keyspace") if k.startswith("db"))


def _per_task(r: redis.Redis, db: int, key: bytes, kind: str, tid: bytes) -> Template | None:
    pttl = max(0, int(r.pttl(key)))
    t = Template(db, kind, key.replace(tid, PH), pttl)
    if kind == "string":
        t.items = [r.get(key).replace(tid, PH)]
    elif kind == "hash":
        t.items = [x.replace(tid, PH) for fv in r.hgetall(key).items() for x in fv]
    elif kind == "set":
        t.items = [m.replace(tid, PH) for m in r.smembers(key)]
    elif kind == "zset":
        t.items = [x for m, s in r.zrange(key, 0, -1, withscores=True) for x in (m.replace(tid, PH), repr(s).encode())]
    elif kind == "list":
        t.items = [m.replace(tid, PH) for m in r.lrange(key, 0, -1)]
    else:
        return None
    return t


def _index(r: redis.Redis, db: int, key: bytes, kind: str, tid: bytes) -> Template | None:
    t = Template(db, kind, key, 0, index=True)
    pat = b"*" + tid + b"*"
    if kind == "hash":
        t.items = [x.replace(tid, PH) for fv in r.hscan_iter(key, match=pat) for x in fv]
    elif kind == "set":
        t.items = [m.replace(tid, PH) for m in r.sscan_iter(key, match=pat)]
    elif kind == "zset":
        t.items = [x for m, s in r.zscan_iter(key, match=pat) for x in (m.replace(tid, PH), repr(s).encode())]
    return t if t.items else None


def discover(host: str, port: int, task_id: str) -> list[Template]:
    tid = task_id.encode()
    base = redis.Redis(host=host, port=port)
    out: list[Template] = []
    for db in _dbs(base):
        r = redis.Redis(host=host, port=port, db=db)
        for key in r.scan_iter(count=1000):
            kind = r.type(key).decode()
            if tid in key:
                t = _per_task(r, db, key, kind, tid)
            elif kind in ("hash", "set", "zset"):
                t = _index(r, db, key, kind, tid)
            else:
                t = None
            if t is not None:
                out.append(t)
    return out


def fill(
    host: str,
    port: int,
    task_id: str,
    templates: list[Template],
    n: int,
    batch: int = 20_000,
    deadline_s: float = 300.0,
    delete: bool = False,
) -> float:
    """Write (or with delete=True remove) `n` synthetic tasks; returns seconds taken. Raises on deadline."""
    prefix = task_id[:-12]
    t0 = time.monotonic()
    by_db: dict[int, list[Template]] = {}
    for t in templates:
        by_db.setdefault(t.db, []).append(t)
    for db, ts in by_db.items():
        r = redis.Redis(host=host, port=port, db=db, socket_timeout=120)
        argv: list[bytes | str | int] = []
        for t in ts:
            nitems = len(t.items) // 2 if t.kind in ("hash", "zset") else len(t.items)
            argv += [t.kind, t.key, t.pttl, nitems, int(t.index), *t.items]
        sha = r.script_load(LUA)
        done = 0
        while done < n:
            if time.monotonic() - t0 > deadline_s:
                raise TimeoutError(f"fill: {done}/{n} after {deadline_s}s")
            k = min(batch, n - done)
            r.evalsha(sha, 0, done + 1, k, prefix, len(ts), "del" if delete else "add", *argv)
            done += k
    return time.monotonic() - t0


def synthetic_id(task_id: str, i: int) -> str:
    return task_id[:-12] + format(i, "012x")
