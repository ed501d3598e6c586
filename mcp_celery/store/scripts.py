"""The Lua scripts behind every multi-key state change that must be atomic.

Pure strings, built from the field names in `schema`, each with a KEYS/ARGV header.
"""

from __future__ import annotations

from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX

__all__ = ["ANSWER", "BEAT", "FREEZE", "JOB_START", "LOST", "OUTCOME", "POST_INPUTS", "PROGRESS", "TAKEN"]

# KEYS[1] task hash, KEYS[2] answers hash, KEYS[3] bell list, KEYS[4] the task's event channel.
# ARGV[1] now (ms), ARGV[2] expiry of answers and bell (s), then key/answer pairs.
# Stores each answer whose key is still outstanding (first answer wins), removes the key
# from the outstanding set, rings the bell once and tells listeners. Returns how many answers
# were taken.
ANSWER = f"""
local taken = 0
for i = 3, #ARGV, 2 do
  if redis.call('HDEL', KEYS[1], '{INPUT_FIELD_PREFIX}' .. ARGV[i]) == 1 then
    redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
    taken = taken + 1
  end
end
if taken > 0 then
  redis.call('HSET', KEYS[1], '{FIELD.UPDATED}', ARGV[1])
  redis.call('LPUSH', KEYS[3], 'answer')
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  redis.call('PUBLISH', KEYS[4], 'answer')
end
return taken
"""

# KEYS[1] task hash, KEYS[2] the task's event channel. ARGV[1] frozen terminal view (JSON).
# Freezes the first terminal state observed, tells listeners when this call froze it, and
# returns the frozen one (nil: no record).
FREEZE = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HSETNX', KEYS[1], '{FIELD.FINAL}', ARGV[1]) == 1 then
  redis.call('PUBLISH', KEYS[2], 'final')
end
return redis.call('HGET', KEYS[1], '{FIELD.FINAL}')
"""

# KEYS[1] task hash, KEYS[2] live sorted set, KEYS[3] the task's event channel. ARGV[1] record
# lifetime (s), ARGV[2] alive-until (ms), ARGV[3] task id, ARGV[4] now (ms), ARGV[5] the STARTED
# progress (JSON), ARGV[6] '1' if the job may run again after an earlier delivery started it
# (at-least-once), then the names of the fields a starting job reads.
# Returns those fields' values (as they were); for an MCP task (a record exists) also restarts the
# record's lifetime, beats once, forgets why an earlier run's heartbeat stopped, and shows the job
# running unless it already has an outcome, except for a second delivery of an at-most-once job,
# which must not run and changes nothing, and for a task that has ended already (frozen, e.g.
# reported lost while its message was in a dead worker's hands), which must not run either. Hands
# the `taken` mark's watch over to the heartbeat. A plain Celery call of the same task has no
# record and writes nothing.
JOB_START = f"""
local values = redis.call('HMGET', KEYS[1], unpack(ARGV, 7))
if ARGV[6] ~= '1' and redis.call('HEXISTS', KEYS[1], '{FIELD.ALIVE_UNTIL}') == 1 then
  return values
end
if redis.call('HEXISTS', KEYS[1], '{FIELD.FINAL}') == 1 then return values end
if redis.call('EXPIRE', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], '{FIELD.ALIVE_UNTIL}', ARGV[2])
  redis.call('HDEL', KEYS[1], '{FIELD.LOST}', '{FIELD.TAKEN}')
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  if redis.call('HEXISTS', KEYS[1], '{FIELD.OUTCOME}') == 0 then
    redis.call('HSET', KEYS[1], '{FIELD.PROGRESS}', ARGV[5], '{FIELD.UPDATED}', ARGV[4])
    redis.call('PUBLISH', KEYS[3], 'started')
  end
end
return values
"""

# KEYS[1] task hash, KEYS[2] the task's event channel. ARGV[1] progress (JSON), ARGV[2] now (ms).
# The job's latest progress, unless it has ended or the record is gone (an HSET would create a
# hash without the record's fields or expiry). Returns 1 when written.
PROGRESS = f"""
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], '{FIELD.OUTCOME}') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], '{FIELD.PROGRESS}', ARGV[1], '{FIELD.UPDATED}', ARGV[2])
redis.call('PUBLISH', KEYS[2], 'progress')
return 1
"""

# KEYS[1] task hash, KEYS[2] the task's event channel. ARGV[1] outcome (JSON).
# The job's outcome: the first one wins (a retry or redelivery cannot change it), and listeners
# are told when this call stored it. Returns 1 when stored.
OUTCOME = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[1], '{FIELD.OUTCOME}', ARGV[1]) == 1 then
  redis.call('PUBLISH', KEYS[2], 'outcome')
  return 1
end
return 0
"""

# KEYS[1] task hash, KEYS[2] live sorted set. ARGV[1] alive-until (ms), ARGV[2] task id.
# A running job's heartbeat: pushes its deadline forward, but never brings back a record that
# has expired (an HSET would create a hash without the record's fields or expiry).
BEAT = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
redis.call('HSET', KEYS[1], '{FIELD.ALIVE_UNTIL}', ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# KEYS[1] task hash, KEYS[2] live sorted set. ARGV[1] taken-until (ms), ARGV[2] task id, ARGV[3]
# '1' to mark (a worker is about to ack the job's message early), '' to beat an existing mark.
# Keeps the task watched from the moment a worker takes its message until the job starts: only
# for an MCP task whose job has not started nor ended (the pool may start it before the worker's
# main process marks it), and a beat only while the mark is there (JOB_START removes it).
# Returns 1 when written; 0 tells the beating thread to stop.
TAKEN = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local seen = redis.call('HMGET', KEYS[1], '{FIELD.ALIVE_UNTIL}', '{FIELD.OUTCOME}', '{FIELD.FINAL}', '{FIELD.TAKEN}')
if seen[1] or seen[2] or seen[3] or (ARGV[3] ~= '1' and not seen[4]) then return 0 end
redis.call('HSET', KEYS[1], '{FIELD.TAKEN}', ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# KEYS[1] task hash. ARGV[1] reason. Notes why a running job's heartbeat is about to stop (its
# worker is shutting down), shown only if it does stop; a record that has expired stays gone.
LOST = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], '{FIELD.LOST}', ARGV[1])
return 1
"""

# KEYS[1] task hash, KEYS[2] answers hash, KEYS[3] the task's event channel. ARGV[1] now (ms),
# then key/request pairs.
# Posts each request that has no stored answer yet (a redelivered job replays answers instead of
# asking again) and tells listeners when it posted any. Returns {cancel-requested, answers...} in
# ARGV order.
POST_INPUTS = f"""
local out = {{redis.call('HGET', KEYS[1], '{FIELD.CANCEL}') or false}}
local posted = 0
for i = 2, #ARGV, 2 do
  local answer = redis.call('HGET', KEYS[2], ARGV[i])
  if not answer then
    redis.call('HSET', KEYS[1], '{INPUT_FIELD_PREFIX}' .. ARGV[i], ARGV[i + 1])
    posted = posted + 1
  end
  out[#out + 1] = answer or false
end
redis.call('HSET', KEYS[1], '{FIELD.UPDATED}', ARGV[1])
if posted > 0 then redis.call('PUBLISH', KEYS[3], 'inputs') end
return out
"""
