"""The Lua scripts behind every multi-key state change that must be atomic.

Pure strings, built from the field names in `schema`, each with a KEYS/ARGV header. Every key a
script touches belongs to one task and shares its hash tag (`Keys`), so each script runs in one
slot of a Redis Cluster. The `live` sorted set is one key for all tasks: the callers write it
beside the script, in the same round trip (see `Keys.live` for why that keeps the guarantees).
The `ended` stream (`mcp_celery.store.ended`) is one key too, but written only inside the scripts
(once per ending, which only a script can tell), and so only on one Redis server: on a cluster
the callers pass no stream key, and the scripts write none.
One script is the exception, and runs only on one Redis server, never a cluster: CLAIM_AND_CREATE
takes a call's claim (a key of its own) and writes the task's record (and its job's message) in one step.
The scripts announce changes with `redis.call('PUBLISH', ...)`; `publishing` makes that SPUBLISH
for a cluster store (sharded pub/sub), the one place the command changes.
"""

from __future__ import annotations

from mcp_celery.store.ended import ENDED
from mcp_celery.store.schema import ARTIFACT_PREFIX, FIELD, INPUT_FIELD_PREFIX, JOB_FIELDS, OUTPUT_EVENT

__all__ = [
    "ANSWER",
    "ARTIFACT_PUT",
    "BEAT",
    "CANCEL",
    "CLAIM_AND_CREATE",
    "CLAIM_CALL",
    "FREEZE",
    "JOB_END",
    "JOB_START",
    "LAUNCH",
    "LOST",
    "OUTPUT_APPEND",
    "OUTPUT_READ",
    "PARK",
    "POST_INPUTS",
    "PROGRESS",
    "RELEASE_CALL",
    "TAKEN",
    "publishing",
]


def publishing(script: str, command: str) -> str:
    """`script` announcing its changes with `command`: "PUBLISH" (as written) or "SPUBLISH" (a cluster store)."""
    return script.replace("redis.call('PUBLISH',", f"redis.call('{command}',")


# KEYS[1] task hash, KEYS[2] answers hash, KEYS[3] bell list, KEYS[4] the task's event channel.
# ARGV[1] now (ms), ARGV[2] expiry of answers and bell (s), then key/answer pairs.
# Stores each answer whose key is still outstanding (first answer wins), removes the key
# from the outstanding set, rings the bell once and tells listeners. A parked job (`FIELD.PARKED`)
# whose last open request this call answered is unparked here, once whoever answers (so two racing
# answers resume it once), its record given a live job's lifetime again: the caller sends its
# message. Returns {the keys taken, the resume signature or false}.
ANSWER = f"""
local taken = {{}}
for i = 3, #ARGV, 2 do
  if redis.call('HDEL', KEYS[1], '{INPUT_FIELD_PREFIX}' .. ARGV[i]) == 1 then
    redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
    taken[#taken + 1] = ARGV[i]
  end
end
local resume = false
if #taken > 0 then
  redis.call('HSET', KEYS[1], '{FIELD.UPDATED}', ARGV[1])
  redis.call('LPUSH', KEYS[3], 'answer')
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  redis.call('PUBLISH', KEYS[4], 'answer')
  if redis.call('HEXISTS', KEYS[1], '{FIELD.PARKED}') == 1 then
    local open = false
    for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
      if string.sub(name, 1, {len(INPUT_FIELD_PREFIX)}) == '{INPUT_FIELD_PREFIX}' then open = true break end
    end
    if not open then
      redis.call('HDEL', KEYS[1], '{FIELD.PARKED}')
      redis.call('EXPIRE', KEYS[1], ARGV[2])
      resume = redis.call('HGET', KEYS[1], '{FIELD.RESUME}') or false
    end
  end
end
return {{taken, resume}}
"""

# KEYS[1] task hash, KEYS[2] bell list, KEYS[3] the task's event channel.
# ARGV[1] now (ms), ARGV[2] expiry of the bell (s), ARGV[3] the cancelled state to freeze (JSON) if
# the job has not started, ARGV[4] the one if it is parked at a question ('': ARGV[3]), ARGV[5] the
# record's expiry (s) once frozen, or ''.
# A cancel request, atomic with JOB_START and PARK (all run on the task hash): a job that has not
# started (no heartbeat yet) or is parked (no heartbeat either: no worker holds it) is cancelled here
# and now, its state frozen, so that JOB_START refuses it whichever worker gets its message later; a
# started job finds the flag at its next checkpoint, and the bell wakes it if it waits. Listeners are
# told either way. Nothing changes for a task that has ended. Returns 'unstarted', 'parked', 'started'
# or 'ended' (false: no record); the caller takes an 'unstarted' or 'parked' task out of `live`. With
# ARGV[6] '1', KEYS[4] is the ended stream: a task cancelled at once adds its entry there (ARGV[7]
# the stream's MAXLEN, ARGV[8] the task id; the reason is the frozen state's message).
CANCEL = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local seen = redis.call('HMGET', KEYS[1], '{FIELD.ALIVE_UNTIL}', '{FIELD.OUTCOME}', '{FIELD.FINAL}',
  '{FIELD.TOOL}', '{FIELD.CREATED}', '{FIELD.PARKED}')
if seen[2] or seen[3] then return 'ended' end
redis.call('HSETNX', KEYS[1], '{FIELD.CANCEL}', ARGV[1])
if not seen[1] then
  local found, final = 'unstarted', ARGV[3]
  if seen[6] then
    found = 'parked'
    if ARGV[4] ~= '' then final = ARGV[4] end
  end
  redis.call('HSET', KEYS[1], '{FIELD.FINAL}', final)
  if ARGV[5] ~= '' then redis.call('EXPIRE', KEYS[1], ARGV[5]) end
  redis.call('PUBLISH', KEYS[3], 'final')
  if ARGV[6] == '1' then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', '{ENDED.TASK}', ARGV[8],
      '{ENDED.TOOL}', seen[4] or '', '{ENDED.CREATED}', seen[5] or '', '{ENDED.STATUS}', 'cancelled',
      '{ENDED.ENDED}', ARGV[1], '{ENDED.REASON}', cjson.decode(final)['message'] or '')
  end
  return found
end
redis.call('LPUSH', KEYS[2], 'cancel')
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', KEYS[3], 'cancel')
return 'started'
"""

# KEYS[1] task hash, KEYS[2] the task's event channel, then the ended stream when the caller reports
# an ending the job cannot (its worker was lost). ARGV[1] frozen terminal view (JSON), then with the
# stream: ARGV[2] its MAXLEN and the entry's field/value pairs.
# Freezes the first terminal state observed, tells listeners (and the stream) when this call froze
# it, and returns the frozen one (nil: no record).
FREEZE = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HSETNX', KEYS[1], '{FIELD.FINAL}', ARGV[1]) == 1 then
  redis.call('PUBLISH', KEYS[2], 'final')
  if #KEYS > 2 then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3)) end
end
return redis.call('HGET', KEYS[1], '{FIELD.FINAL}')
"""

# KEYS[1] task hash. ARGV[1] record lifetime (s), ARGV[2]
# alive-until (ms), ARGV[3] now (ms), ARGV[4] the STARTED progress (JSON), ARGV[5] '1' if the job
# may run again after an earlier delivery started it (at-least-once), ARGV[6] how long (ms) the task
# may have waited since its creation before its record needs a new lifetime (the one set at
# creation still outlives the job then).
# Returns the values (as they were) of the fields a starting job reads, `JOB_FIELDS` in its order
# (written into the script rather than sent with every call: a job start is on every job's path;
# they include the tool, the creation time, the heartbeat, the outcome, the frozen state and why an
# earlier heartbeat stopped); for an MCP task (a record exists) also restarts the
# record's lifetime if it waited long, beats once, forgets why an earlier run's heartbeat stopped,
# and shows the job running unless it already has an outcome, except for a second delivery of an
# at-most-once job, which must not run and changes nothing, and for a task that has ended already
# (frozen: cancelled before its start, or reported lost while its message was in a dead worker's
# hands), which must not run either. A `taken` mark is left as it is: once the heartbeat is set
# every reader ignores it. A plain Celery call of the same task has no record and writes nothing.
# One read, then the writes. Listeners are not told here: the job's heartbeat thread tells them a
# moment later if the job still runs then (`mcp_celery.worker.heartbeat`); a shorter job's outcome does.
# The caller scores the task in `live` by the heartbeat's deadline just before.
JOB_START = f"""
local names = {{{", ".join(repr(name) for name in JOB_FIELDS)}}}
local values = redis.call('HMGET', KEYS[1], unpack(names))
local seen = {{}}
for i, name in ipairs(names) do seen[name] = values[i] end
if not seen['{FIELD.TOOL}'] then return values end
if ARGV[5] ~= '1' and seen['{FIELD.ALIVE_UNTIL}'] then return values end
if seen['{FIELD.FINAL}'] then return values end
if tonumber(ARGV[3]) - tonumber(seen['{FIELD.CREATED}']) > tonumber(ARGV[6]) then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
if seen['{FIELD.OUTCOME}'] then
  redis.call('HSET', KEYS[1], '{FIELD.ALIVE_UNTIL}', ARGV[2])
else
  redis.call('HSET', KEYS[1], '{FIELD.ALIVE_UNTIL}', ARGV[2], '{FIELD.PROGRESS}', ARGV[4], '{FIELD.UPDATED}', ARGV[3])
end
if seen['{FIELD.LOST}'] then redis.call('HDEL', KEYS[1], '{FIELD.LOST}') end
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

# KEYS[1] task hash, KEYS[2] the task's event channel, then the task's answers hash and bell list
# when it asked for input, then the ended stream when ARGV[3] is '1'. ARGV[1] the outcome (JSON) or
# '' (none of its own: a retry or a redelivery to come), ARGV[2] the TTL (s) or '' (kept for ever),
# then with the stream: ARGV[4] its MAXLEN and the entry's field/value pairs (`EndedEntry.to_args`;
# a tool and creation time of '' are read from the record: the worker's main process ends a job
# whose record it has not read).
# A job's end, in one round trip: its outcome (the first one wins, so a retry or a redelivery cannot
# change it; listeners and the stream are told when this call stored it), the record (and its
# answers and bell) kept for the TTL from now (the caller takes the task off the live set just
# after). A record that has expired stays gone. A parked one is left as it is: its run ended at the
# park, and an end heard after it (the worker's main process told that the pool process was lost
# before Celery heard the run end, as a warm shutdown's SIGTERM to the process group can do) is not
# the task's; the answer runs the job again. Returns 1 when this call stored the outcome.
JOB_END = f"""
if redis.call('HEXISTS', KEYS[1], '{FIELD.PARKED}') == 1 then return 0 end
local exists
if ARGV[2] ~= '' then
  exists = redis.call('EXPIRE', KEYS[1], ARGV[2]) == 1
else
  exists = redis.call('EXISTS', KEYS[1]) == 1
  if exists then redis.call('PERSIST', KEYS[1]) end
end
if not exists then return 0 end
local owned = #KEYS
if ARGV[3] == '1' then owned = owned - 1 end
for i = 3, owned do
  if ARGV[2] ~= '' then redis.call('EXPIRE', KEYS[i], ARGV[2]) else redis.call('PERSIST', KEYS[i]) end
end
if ARGV[1] ~= '' and redis.call('HSETNX', KEYS[1], '{FIELD.OUTCOME}', ARGV[1]) == 1 then
  redis.call('PUBLISH', KEYS[2], 'outcome')
  if ARGV[3] == '1' then
    local entry = {{unpack(ARGV, 5)}}
    if entry[4] == '' then
      local seen = redis.call('HMGET', KEYS[1], '{FIELD.TOOL}', '{FIELD.CREATED}')
      entry[4], entry[6] = seen[1] or '', seen[2] or ''
    end
    redis.call('XADD', KEYS[#KEYS], 'MAXLEN', '~', ARGV[4], '*', unpack(entry))
  end
  return 1
end
return 0
"""

# KEYS[1] task hash. ARGV[1] alive-until (ms).
# A running job's heartbeat: pushes its deadline forward, but never brings back a record that
# has expired (an HSET would create a hash without the record's fields or expiry), nor a heartbeat
# to a job that has just parked (a beat in flight as it parks). The caller scores the task in `live`
# by the same deadline just before.
BEAT = f"""
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], '{FIELD.PARKED}') == 1 then return 0 end
redis.call('HSET', KEYS[1], '{FIELD.ALIVE_UNTIL}', ARGV[1])
return 1
"""

# KEYS[1] task hash. ARGV[1] taken-until (ms), ARGV[2] '1' to mark (a worker is about to ack the
# job's message early), '' to beat an existing mark (the caller scores the task in `live`: after a
# mark, only if it marked; before a beat, where it still is).
# Keeps the task watched from the moment a worker takes its message until the job starts: only
# for an MCP task (its record has a tool) whose job has not started nor ended (the pool may start it
# before the worker's main process marks it), nor parked (a job that parked before the main process
# heard its run end has no heartbeat either: marked, the parked task would read lost once the mark ran
# out), and a beat only while the mark is there.
# Returns 1 when written; 0 tells the beating thread to stop.
TAKEN = f"""
local seen = redis.call('HMGET', KEYS[1], '{FIELD.TOOL}', '{FIELD.ALIVE_UNTIL}', '{FIELD.OUTCOME}', '{FIELD.FINAL}',
  '{FIELD.TAKEN}', '{FIELD.PARKED}')
if not seen[1] or seen[2] or seen[3] or seen[4] or seen[6] or (ARGV[2] ~= '1' and not seen[5]) then return 0 end
redis.call('HSET', KEYS[1], '{FIELD.TAKEN}', ARGV[1])
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

# KEYS[1] task hash, KEYS[2] the task's event channel. ARGV[1] the workflow (JSON).
# A job hands its task over to a workflow whose members' records exist already: refused (0) when
# the task was cancelled or has ended meanwhile (its members are then never sent), atomic with
# CANCEL, which reads the workflow to cancel its members. Tells listeners. Returns 1 when taken.
LAUNCH = f"""
local seen = redis.call('HMGET', KEYS[1], '{FIELD.TOOL}', '{FIELD.CANCEL}', '{FIELD.FINAL}')
if not seen[1] or seen[2] or seen[3] then return 0 end
redis.call('HSET', KEYS[1], '{FIELD.WORKFLOW}', ARGV[1])
redis.call('PUBLISH', KEYS[2], 'workflow')
return 1
"""

# KEYS[1] task hash, KEYS[2] answers hash, KEYS[3] bell list. ARGV[1] when the question times out
# (ms), ARGV[2] the signature that resumes the job (JSON), ARGV[3] the record's lifetime (s), then
# the wire keys the job waits for.
# A job parks at its open question (`mcp_celery.worker.parking`), atomic with ANSWER and CANCEL:
# refused ('cancel') once the task is cancelled or has ended, and ('answered') when every key was
# answered meanwhile (the job reads the answers and goes on). Else the task keeps its input requests
# and no job: no heartbeat (a parked task is not a lost one, and its resumed message may start the job
# again), no `taken` mark, no note of a lost run; a `retry_on_worker_loss` job's run is not counted
# twice (park and resume are one run); the record lives until the question times out, then a live
# task's lifetime. The caller scores the task in `live` by the timeout, in the same pipeline.
PARK = f"""
local seen = redis.call('HMGET', KEYS[1], '{FIELD.TOOL}', '{FIELD.CANCEL}', '{FIELD.FINAL}', '{FIELD.OUTCOME}')
if not seen[1] or seen[2] or seen[3] or seen[4] then return 'cancel' end
local open = false
for i = 4, #ARGV do
  if redis.call('HEXISTS', KEYS[1], '{INPUT_FIELD_PREFIX}' .. ARGV[i]) == 1 then open = true end
end
if not open then return 'answered' end
redis.call('HSET', KEYS[1], '{FIELD.PARKED}', ARGV[1], '{FIELD.RESUME}', ARGV[2])
redis.call('HDEL', KEYS[1], '{FIELD.ALIVE_UNTIL}', '{FIELD.TAKEN}', '{FIELD.LOST}')
if redis.call('HEXISTS', KEYS[1], '{FIELD.RUNS}') == 1 then redis.call('HINCRBY', KEYS[1], '{FIELD.RUNS}', -1) end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
return 'parked'
"""


# KEYS[1] task hash, then the keys that hold the new artifact's bytes in Redis (ARGV[5] of them: none
# when a file system holds them; one key when the bytes are in ARGV[7]; else the chunks the worker
# streamed, `SyncStore.stage_artifact`), then the keys of the artifact of that name it replaces, as
# the caller found it (ARGV[6], its entry, '' for none).
# ARGV[1] the artifact's name, ARGV[2] its meta (JSON), ARGV[3] its size, ARGV[4] the task's quota
# (bytes of artifacts in Redis) or '', ARGV[5] how many keys the new bytes take, ARGV[6] the entry it
# replaces as the caller read it, ARGV[7] the bytes, set here (absent: the keys were written already).
# An artifact of a task whose record still exists, in one step: the quota counts every other
# artifact of the task (one written again under the same name replaces it, and its keys go); the new
# keys expire with the record as it stands (JOB_END's caller expires them again with it,
# `SyncStore.expire_artifacts`). Chunks written already are deleted when refused, so that nothing stays
# behind. Returns {1, 0} when stored, {0, used} when over the quota, {-1, 0} when the record is gone, and
# {-2, 0} when the entry it replaces changed since the caller read it (nothing done: read it again).
ARTIFACT_PUT = f"""
local count = tonumber(ARGV[5])
local function refuse(code, used)
  if #ARGV < 7 then
    for i = 2, count + 1 do redis.call('DEL', KEYS[i]) end
  end
  return {{code, used}}
end
if redis.call('EXISTS', KEYS[1]) == 0 then return refuse(-1, 0) end
local field = '{ARTIFACT_PREFIX}' .. ARGV[1]
if (redis.call('HGET', KEYS[1], field) or '') ~= ARGV[6] then return {{-2, 0}} end
if ARGV[4] ~= '' then
  local used = 0
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if all[i] ~= field and string.sub(all[i], 1, {len(ARTIFACT_PREFIX)}) == '{ARTIFACT_PREFIX}' then
      used = used + cjson.decode(all[i + 1])['size']
    end
  end
  if used + tonumber(ARGV[3]) > tonumber(ARGV[4]) then return refuse(0, used) end
end
if #ARGV >= 7 then redis.call('SET', KEYS[2], ARGV[7]) end
local new = {{}}
for i = 2, count + 1 do new[KEYS[i]] = true end
for i = count + 2, #KEYS do
  if not new[KEYS[i]] then redis.call('DEL', KEYS[i]) end
end
local ttl = redis.call('PTTL', KEYS[1])
for i = 2, count + 1 do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[i], ttl) elseif ttl == -1 then redis.call('PERSIST', KEYS[i]) end
end
redis.call('HSET', KEYS[1], field, ARGV[2])
return {{1, 0}}
"""


# KEYS[1] task hash, KEYS[2] the task's output, KEYS[3] the task's event channel. ARGV[1] the text
# (bytes), ARGV[2] the bytes kept, ARGV[3] how far past them the output may grow before it is cut back,
# ARGV[4] bytes of this text the caller dropped already (a text longer than what is kept).
# Appends to a task's live output while its record exists, in one round trip: cutting the output
# back to the bytes kept only once it outgrew them by the slack makes the copy rare (one per slack's
# worth of text), and readers cut the rest (`mcp_celery.store.output`). The dropped bytes are counted
# in the record; the output expires with the record as it stands (JOB_END's caller expires it again,
# `SyncStore.expire_artifacts`). Tells listeners. Returns 1 when written, 0 when the record is gone.
OUTPUT_APPEND = f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local size = redis.call('APPEND', KEYS[2], ARGV[1])
local keep, dropped = tonumber(ARGV[2]), tonumber(ARGV[4])
if size > keep + tonumber(ARGV[3]) then
  redis.call('SET', KEYS[2], redis.call('GETRANGE', KEYS[2], size - keep, -1))
  dropped = dropped + size - keep
end
if dropped > 0 then redis.call('HINCRBY', KEYS[1], '{FIELD.OUTPUT_DROPPED}', dropped) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) elseif ttl == -1 then redis.call('PERSIST', KEYS[2]) end
redis.call('PUBLISH', KEYS[3], '{OUTPUT_EVENT}')
return 1
"""

# KEYS[1] task hash, KEYS[2] the task's output.
# The output and the count of bytes dropped before it, read together (an append between two reads
# could cut the output and count the cut in between). Returns {dropped or false, output or false}.
OUTPUT_READ = f"""
return {{redis.call('HGET', KEYS[1], '{FIELD.OUTPUT_DROPPED}'), redis.call('GET', KEYS[2])}}
"""


# KEYS[1] a call's claim: an idempotency key's or a dedupe window's (`Keys.idempotency_key`, `Keys.recent_call`).
# ARGV[1] this call's claim (JSON: its task, its call's digest, when), ARGV[2] the claim's lifetime (ms),
# ARGV[3] a claim the caller found stale and may replace (its task gone, or ended for a window), or ''.
# Claims the call for this request unless another one holds it: one key, read and written in one step,
# so of any number of calls racing with one key exactly one creates a task and the others find it.
# Returns false when claimed, else the claim held (the caller reads its task).
CLAIM_CALL = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[3] then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

# KEYS[1] a call's claim, KEYS[2] the new task's hash; on one Redis server only (the claim is in another slot).
# ARGV[1..3] as CLAIM_CALL's, ARGV[4] the record's lifetime (s), ARGV[5] how many field/value pairs of the
# record follow, the pairs, then the commands that queue the job's message when the broker is this database
# (kombu's LPUSH, PEXPIRE, PUBLISH), each as its name, its argument count and its arguments.
# CLAIM_CALL and the record's write (HSET, EXPIRE; then the message) in one step, so that a call with a key
# costs the round trips of one without: nothing is written unless this call takes the claim. Returns as
# CLAIM_CALL does.
CLAIM_AND_CREATE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[3] then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local last = 5 + 2 * tonumber(ARGV[5])
redis.call('HSET', KEYS[2], unpack(ARGV, 6, last))
redis.call('EXPIRE', KEYS[2], ARGV[4])
local i = last + 1
while i <= #ARGV do
  local count = tonumber(ARGV[i + 1])
  redis.call(ARGV[i], unpack(ARGV, i + 2, i + 1 + count))
  i = i + 2 + count
end
return false
"""

# KEYS[1] a call's claim. ARGV[1] the claim to drop: the caller's, whose task could not be created.
# Dropped only while it still holds ARGV[1] (another call may have replaced it since). Returns 1 when dropped.
RELEASE_CALL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
