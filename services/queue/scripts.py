"""The Lua scripts that change queue state, each one atomic and idempotent.

Why Lua: every transition (dispatch, start, finish, retry, re-delivery, cancel, dead letter)
touches a task hash, a batch hash, a node's outstanding set and a stream together. Running them
as one script makes each transition all-or-nothing, so a crash of any process at any moment
leaves a consistent state, and a script replayed after a lost reply (a client retrying across a
Redis restart) recognises that it already happened. Scripts are written for one Redis instance
(they build key names from the prefix in ARGV[1], so they are not Redis Cluster compatible).

Task states: ``pending`` (in the pending list) -> ``dispatched`` (an entry on a node stream) ->
``running`` (a worker started it) -> ``done`` | ``cancelled`` | ``dead``; a retry or a
re-delivery goes back to ``pending``. A task's ``entry`` field names the one stream entry that
currently stands for it; reports carrying another entry are stale or duplicates.
"""

from __future__ import annotations

import redis
from redis.commands.core import Script

# Shared helpers, prepended to the scripts that need them. ARGV[1] is always the prefix.
_COMMON = r"""
local P = ARGV[1]

local function wake()
  redis.call('LPUSH', P .. 'manager:wake', '1')
  redis.call('LTRIM', P .. 'manager:wake', 0, 0)
end

-- An aborted result written by the queue itself (cancel, dead letter): same JSON schema as a
-- worker's TaskResult so readers need one parser.
local function synth(tk, tid, reason, now)
  local h = redis.call('HMGET', tk, 'batch', 'attempt', 'node')
  local node = h[3]
  if not node or node == '' then node = 'unassigned' end
  return cjson.encode({
    task_id = tid, batch_id = h[1], trajectory_id = tid .. '.a' .. h[2], node = node,
    attempt = tonumber(h[2]), finished_at = tonumber(now),
    outcome = {status = 'aborted', reward = cjson.null, abort_reason = reason},
  })
end

-- Record the one final result of a task; counter is the batch counter to bump
-- (completed | timeout | error | aborted | cancelled | dead).
local function finalize(tk, tid, batch, result, counter, now, state, results_maxlen)
  redis.call('HSET', tk, 'state', state, 'result', result, 'finished', now)
  local bk = P .. 'batch:' .. batch
  local done = redis.call('HINCRBY', bk, 'n_done', 1)
  redis.call('HINCRBY', bk, 'n_' .. counter, 1)
  redis.call('XADD', P .. 'batch:' .. batch .. ':results', '*', 'task_id', tid, 'result', result)
  redis.call('XADD', P .. 'results', 'MAXLEN', '~', results_maxlen, '*',
             'batch_id', batch, 'task_id', tid, 'result', result)
  if done >= tonumber(redis.call('HGET', bk, 'total')) then
    if redis.call('HGET', bk, 'state') == 'running' then redis.call('HSET', bk, 'state', 'done') end
    redis.call('HSET', bk, 'finished', now)
  end
end

local function drop_entry(stream, entry)
  redis.call('XACK', stream, 'workers', entry)
  redis.call('XDEL', stream, entry)
end
"""

# ARGV: prefix, batch_id, job_id, request_json, now, then (task_id, payload, max_attempts)*.
# Returns nil when created, the stored request JSON when the batch already existed.
SUBMIT = (
    _COMMON
    + r"""
local bid, job, req, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local bk = P .. 'batch:' .. bid
if redis.call('EXISTS', bk) == 1 then return redis.call('HGET', bk, 'request') end
local n = (#ARGV - 5) / 3
redis.call('HSET', bk, 'request', req, 'job', job, 'state', 'running', 'total', n,
           'n_done', 0, 'n_running', 0, 'created', now)
for i = 0, n - 1 do
  local tid = ARGV[6 + 3 * i]
  redis.call('HSET', P .. 'task:' .. tid, 'batch', bid, 'state', 'pending', 'attempt', 1,
             'failures', 0, 'lost', 0, 'deliveries', 0, 'max_attempts', ARGV[8 + 3 * i],
             'payload', ARGV[7 + 3 * i], 'created', now)
  redis.call('RPUSH', P .. 'batch:' .. bid .. ':tasks', tid)
  redis.call('LPUSH', P .. 'pending', tid)
end
redis.call('ZADD', P .. 'batches', now, bid)
redis.call('SADD', P .. 'job:' .. job .. ':batches', bid)
redis.call('HINCRBY', P .. 'job:' .. job, 'n_batches', 1)
redis.call('HINCRBY', P .. 'job:' .. job, 'n_tasks', n)
wake()
return false
"""
)

# ARGV: prefix, node, max_outstanding, n, now, dead_maxlen.
# Moves up to n pending tasks onto the node's stream while the node's outstanding set stays
# below max_outstanding. Returns {sent, pending_left}; pending_left is -1 for a dead node and
# -2 for a draining one (nothing sent).
DISPATCH = (
    _COMMON
    + r"""
local node, maxo, n, now = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local hb = P .. 'node:' .. node
if redis.call('EXISTS', hb) == 0 then return {0, -1} end
if redis.call('HGET', hb, 'draining') == '1' then return {0, -2} end
local assigned = P .. 'node:' .. node .. ':assigned'
local stream = P .. 'tasks:' .. node
if redis.call('EXISTS', stream) == 0 then
  redis.pcall('XGROUP', 'CREATE', stream, 'workers', '0', 'MKSTREAM')
end
local sent = 0
while sent < n do
  if redis.call('SCARD', assigned) >= maxo then break end
  local tid = redis.call('RPOP', P .. 'pending')
  if not tid then break end
  local tk = P .. 'task:' .. tid
  local h = redis.call('HMGET', tk, 'state', 'attempt', 'payload')
  if h[1] == 'pending' then
    local id = redis.call('XADD', stream, '*', 'task_id', tid, 'attempt', h[2], 'payload', h[3])
    redis.call('HSET', tk, 'state', 'dispatched', 'node', node, 'entry', id, 'dispatched', now)
    redis.call('SADD', assigned, tid)
    sent = sent + 1
  elseif not h[1] then
    redis.call('XADD', P .. 'dead', 'MAXLEN', '~', ARGV[6], '*', 'source', P .. 'pending',
               'task_id', tid, 'reason', 'unknown task id in the pending list', 'at', now)
  end
  -- any other state: a stale id (cancelled, or already finished by an earlier attempt)
end
return {sent, redis.call('LLEN', P .. 'pending')}
"""
)

# ARGV: prefix, task_id, entry, node, now.
# Returns 'running' when the worker may run the task; anything else means "drop this entry"
# (it has been acked): the task was cancelled, finished or re-delivered elsewhere meanwhile.
START = (
    _COMMON
    + r"""
local tid, entry, node, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tk = P .. 'task:' .. tid
local stream = P .. 'tasks:' .. node
local h = redis.call('HMGET', tk, 'state', 'entry', 'batch')
-- Replayed after a lost reply: already started by this very entry, nothing to change.
if h[1] == 'running' and h[2] == entry then return 'running' end
if h[1] ~= 'dispatched' or h[2] ~= entry then
  drop_entry(stream, entry)
  if h[2] == entry then redis.call('SREM', P .. 'node:' .. node .. ':assigned', tid) end
  return h[1] or 'unknown'
end
redis.call('HSET', tk, 'state', 'running', 'started', now)
redis.call('HINCRBY', tk, 'deliveries', 1)
redis.call('HINCRBY', P .. 'batch:' .. h[3], 'n_running', 1)
return 'running'
"""
)

# ARGV: prefix, task_id, entry, node, result_json, status, reason, now, results_maxlen,
#       retryable ('1': an aborted attempt is retried up to max_attempts; '0': a deterministic
#       failure such as an unknown instance or a missing image, final at once).
# Returns 'final' | 'retry' | 'duplicate' | 'stale' | 'unknown'.
COMPLETE = (
    _COMMON
    + r"""
local tid, entry, node, result = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local status, reason, now, rmax = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local tk = P .. 'task:' .. tid
drop_entry(P .. 'tasks:' .. node, entry)
local h = redis.call('HMGET', tk, 'state', 'entry', 'batch', 'attempt', 'failures', 'max_attempts')
local state = h[1]
if not state then return 'unknown' end
local current = (h[2] == entry)
if current then redis.call('SREM', P .. 'node:' .. node .. ':assigned', tid) end
if state == 'done' or state == 'cancelled' or state == 'dead' then return 'duplicate' end
-- A late aborted report of an earlier attempt changes nothing; a late genuine result of an
-- earlier attempt is accepted (first result wins; the current run will report a duplicate).
if not current and status == 'aborted' then return 'stale' end
local batch = h[3]
if state == 'running' then redis.call('HINCRBY', P .. 'batch:' .. batch, 'n_running', -1) end
if status == 'aborted' and current and ARGV[10] ~= '0' then
  local failures = redis.call('HINCRBY', tk, 'failures', 1)
  if failures < tonumber(h[6]) then
    redis.call('HSET', tk, 'state', 'pending', 'attempt', tonumber(h[4]) + 1, 'node', '',
               'entry', '', 'last_error', reason)
    redis.call('RPUSH', P .. 'pending', tid)
    redis.call('HINCRBY', P .. 'batch:' .. batch, 'n_retries', 1)
    wake()
    return 'retry'
  end
end
finalize(tk, tid, batch, result, status, now, 'done', rmax)
wake()
return 'final'
"""
)

# ARGV: prefix, task_id, entry, node, reason, kind, max_deliveries, now, dead_maxlen,
#       results_maxlen. kind: 'lost' (its worker died), 'handback' (worker shutdown) or
#       'rebalance' (a queued entry moved to a node with a free slot).
# Hands a task back to the pending list (front). A task that had started gets a new attempt
# (a new trajectory id); a 'lost' one counts towards max_deliveries, after which the task is
# dead-lettered and reported aborted.
# Returns 'requeued' | 'dead' | 'terminal' | 'stale' | 'unknown'.
REQUEUE = (
    _COMMON
    + r"""
local tid, entry, node, reason = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local kind, maxd, now = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local tk = P .. 'task:' .. tid
local stream = P .. 'tasks:' .. node
drop_entry(stream, entry)
local h = redis.call('HMGET', tk, 'state', 'entry', 'batch', 'attempt', 'lost', 'payload')
if not h[1] then return 'unknown' end
if h[2] ~= entry then return 'stale' end
redis.call('SREM', P .. 'node:' .. node .. ':assigned', tid)
local state = h[1]
if state ~= 'dispatched' and state ~= 'running' then return 'terminal' end
local bk = P .. 'batch:' .. h[3]
if kind == 'rebalance' then
  redis.call('HINCRBY', bk, 'n_rebalanced', 1)
else
  redis.call('HINCRBY', bk, 'n_requeued', 1)
end
if state == 'running' then
  redis.call('HINCRBY', bk, 'n_running', -1)
  if kind == 'lost' then
    local lost = redis.call('HINCRBY', tk, 'lost', 1)
    if lost >= maxd then
      local why = 'dead-lettered: handed to workers ' .. lost ..
                  ' times without a result (last: ' .. reason .. ')'
      redis.call('XADD', P .. 'dead', 'MAXLEN', '~', ARGV[9], '*', 'source', stream,
                 'entry', entry, 'task_id', tid, 'reason', why, 'payload', h[6], 'at', now)
      finalize(tk, tid, h[3], synth(tk, tid, why, now), 'dead', now, 'dead', ARGV[10])
      wake()
      return 'dead'
    end
  end
  redis.call('HSET', tk, 'attempt', tonumber(h[4]) + 1)
end
redis.call('HSET', tk, 'state', 'pending', 'node', '', 'entry', '', 'last_error', reason)
redis.call('RPUSH', P .. 'pending', tid)
wake()
return 'requeued'
"""
)

# ARGV: prefix, node, entry, reason, raw_fields_json, task_id ('' if unknown), now,
#       dead_maxlen, results_maxlen.
# An entry that cannot be run (invalid payload): copy it to the dead-letter stream with the
# reason, ack and delete it, and if it stood for a live task, report that task aborted.
DEAD_LETTER = (
    _COMMON
    + r"""
local node, entry, reason, raw, tid, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local stream = P .. 'tasks:' .. node
redis.call('XADD', P .. 'dead', 'MAXLEN', '~', ARGV[8], '*', 'source', stream, 'entry', entry,
           'task_id', tid, 'reason', reason, 'fields', raw, 'at', now)
drop_entry(stream, entry)
if tid == '' then return 'dead' end
local tk = P .. 'task:' .. tid
local h = redis.call('HMGET', tk, 'state', 'entry', 'batch')
if h[2] ~= entry or (h[1] ~= 'dispatched' and h[1] ~= 'running') then return 'dead' end
redis.call('SREM', P .. 'node:' .. node .. ':assigned', tid)
if h[1] == 'running' then redis.call('HINCRBY', P .. 'batch:' .. h[3], 'n_running', -1) end
finalize(tk, tid, h[3], synth(tk, tid, 'dead-lettered: ' .. reason, now), 'dead', now, 'dead',
         ARGV[9])
wake()
return 'finalized'
"""
)

# ARGV: prefix, batch_id, now, results_maxlen.
# Marks the batch cancelled, reports every unfinished task aborted ("cancelled") at once, and
# tells workers (cancel key + pub/sub) to stop the running ones. Returns the number of tasks
# cancelled, or -1 for an unknown batch.
CANCEL = (
    _COMMON
    + r"""
local bid, now, rmax = ARGV[2], ARGV[3], ARGV[4]
local bk = P .. 'batch:' .. bid
if redis.call('EXISTS', bk) == 0 then return -1 end
redis.call('SET', P .. 'cancel:' .. bid, now)
if redis.call('HGET', bk, 'state') == 'running' then
  redis.call('HSET', bk, 'state', 'cancelled', 'cancelled', now)
end
local n = 0
for _, tid in ipairs(redis.call('LRANGE', P .. 'batch:' .. bid .. ':tasks', 0, -1)) do
  local tk = P .. 'task:' .. tid
  local h = redis.call('HMGET', tk, 'state', 'node')
  if h[1] == 'pending' or h[1] == 'dispatched' or h[1] == 'running' then
    -- A dispatched task frees its node's budget now; a running one when its worker reports.
    if h[1] == 'dispatched' then
      redis.call('SREM', P .. 'node:' .. h[2] .. ':assigned', tid)
    end
    if h[1] == 'running' then redis.call('HINCRBY', bk, 'n_running', -1) end
    finalize(tk, tid, bid, synth(tk, tid, 'cancelled', now), 'cancelled', now, 'cancelled', rmax)
    n = n + 1
  end
end
redis.call('PUBLISH', P .. 'cancel', bid)
wake()
return n
"""
)


class Scripts:
    """The registered scripts of one client (EVALSHA, reloaded automatically after a restart)."""

    def __init__(self, client: redis.Redis) -> None:
        self.submit: Script = client.register_script(SUBMIT)
        self.dispatch: Script = client.register_script(DISPATCH)
        self.start: Script = client.register_script(START)
        self.complete: Script = client.register_script(COMPLETE)
        self.requeue: Script = client.register_script(REQUEUE)
        self.dead_letter: Script = client.register_script(DEAD_LETTER)
        self.cancel: Script = client.register_script(CANCEL)
