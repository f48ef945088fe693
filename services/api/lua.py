"""The job store's Lua scripts: every state change of a job is one atomic script.

A job is a hash ``<p>job:<id>``; it sits in four index sorted sets (``<p>idx:<kind>:<state>``,
``<p>idx:<kind>:*``, ``<p>idx:*:<state>``, ``<p>idx:*:*``, scored by its submission sequence) so
that listing by kind and/or state is one range read. A queued job is also in
``<p>queue:<kind>:<group>`` (FIFO by sequence); a claimed one in ``<p>active:<kind>:<group>``,
scored by its lease deadline (ms). Scripts compute keys from the prefix (one Redis, no cluster).

Quota: ``<p>inflight:<submitter>`` is the set of the submitter's unfinished jobs. SUBMIT checks
its size against the submitter's limit and adds the new job in the same script (so concurrent
submissions cannot both pass the last free place); every script that ends a job removes it.
Before refusing, SUBMIT drops members that are finished or gone (a job ended by an older
version of these scripts), so the count heals itself.
"""

from __future__ import annotations

# Shared helpers, prepended to every script.
PRELUDE = """
local P = ARGV[1]
local function move(id, kind, seq, old, new)
  if old then
    redis.call('ZREM', P..'idx:'..kind..':'..old, id)
    redis.call('ZREM', P..'idx:*:'..old, id)
  end
  redis.call('ZADD', P..'idx:'..kind..':'..new, seq, id)
  redis.call('ZADD', P..'idx:*:'..new, seq, id)
end
local function terminal(state)
  return state == 'succeeded' or state == 'failed' or state == 'cancelled'
end
local function settle(id)
  local by = redis.call('HGET', P..'job:'..id, 'submitted_by')
  if by then redis.call('SREM', P..'inflight:'..by, id) end
end
"""

# ARGV: prefix, id, kind, group, spec, submitted_by, now, message, idem_key, idem_value, ttl,
# max_in_flight (0: no limit). Returns {'new', id}, {'existing', idem_value} or
# {'quota', in_flight} (nothing written).
SUBMIT = (
    PRELUDE
    + """
local id, kind, group = ARGV[2], ARGV[3], ARGV[4]
if ARGV[9] ~= '' then
  local old = redis.call('GET', ARGV[9])
  if old then return {'existing', old} end
end
local inflight, limit = P..'inflight:'..ARGV[6], tonumber(ARGV[12])
if limit > 0 and redis.call('SCARD', inflight) >= limit then
  for _, old in ipairs(redis.call('SMEMBERS', inflight)) do
    local state = redis.call('HGET', P..'job:'..old, 'state')
    if not state or terminal(state) then redis.call('SREM', inflight, old) end
  end
  local n = redis.call('SCARD', inflight)
  if n >= limit then return {'quota', tostring(n)} end
end
if ARGV[9] ~= '' then
  redis.call('SET', ARGV[9], ARGV[10], 'EX', tonumber(ARGV[11]))
end
redis.call('SADD', inflight, id)
local seq = redis.call('INCR', P..'seq')
redis.call('HSET', P..'job:'..id, 'id', id, 'kind', kind, 'group', group, 'state', 'queued',
  'spec', ARGV[5], 'submitted_by', ARGV[6], 'created_at', ARGV[7], 'updated_at', ARGV[7],
  'seq', seq, 'attempt', 0, 'message', ARGV[8], 'progress', '{}', 'metrics', '{}')
redis.call('ZADD', P..'idx:'..kind..':*', seq, id)
redis.call('ZADD', P..'idx:*:*', seq, id)
move(id, kind, seq, nil, 'queued')
redis.call('ZADD', P..'queue:'..kind..':'..group, seq, id)
return {'new', id}
"""
)

# ARGV: prefix, kind, group, holder, now_ms, ttl_ms, max_active, now_s
# Expired leases go back to the queue first; returns {id, attempt} or false.
CLAIM = (
    PRELUDE
    + """
local kind, group, holder = ARGV[2], ARGV[3], ARGV[4]
local now_ms, ttl_ms, max_active = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local queue, active = P..'queue:'..kind..':'..group, P..'active:'..kind..':'..group
for _, id in ipairs(redis.call('ZRANGEBYSCORE', active, '-inf', now_ms)) do
  redis.call('ZREM', active, id)
  local key = P..'job:'..id
  local state = redis.call('HGET', key, 'state')
  local seq = redis.call('HGET', key, 'seq')
  if state == 'cancelling' then
    move(id, kind, seq, state, 'cancelled')
    redis.call('HSET', key, 'state', 'cancelled', 'holder', '', 'finished_at', ARGV[8],
      'updated_at', ARGV[8], 'message', 'cancelled (its runner was lost)')
    settle(id)
  elseif state and not terminal(state) then
    move(id, kind, seq, state, 'queued')
    redis.call('HSET', key, 'state', 'queued', 'holder', '', 'updated_at', ARGV[8],
      'message', 'lease of '..redis.call('HGET', key, 'holder')..' expired: queued again')
    redis.call('ZADD', queue, seq, id)
  end
end
if redis.call('ZCARD', active) >= max_active then return false end
while true do
  local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if #first == 0 then return false end
  local id, seq = first[1], first[2]
  redis.call('ZREM', queue, id)
  local key = P..'job:'..id
  local state = redis.call('HGET', key, 'state')
  if state == 'queued' then
    local attempt = redis.call('HINCRBY', key, 'attempt', 1)
    move(id, kind, seq, state, 'running')
    redis.call('HSET', key, 'state', 'running', 'holder', holder, 'updated_at', ARGV[8],
      'message', 'claimed by '..holder)
    if not redis.call('HGET', key, 'started_at') then
      redis.call('HSET', key, 'started_at', ARGV[8])
    end
    redis.call('ZADD', active, now_ms + ttl_ms, id)
    return {id, attempt}
  end
end
"""
)

# ARGV: prefix, id, holder, now_ms, ttl_ms, now_s, progress ('' keeps), metrics ('' keeps)
# Returns the job's state ('running' or 'cancelling'), or 'lost' when the holder lost it.
HEARTBEAT = (
    PRELUDE
    + """
local key = P..'job:'..ARGV[2]
local h = redis.call('HMGET', key, 'holder', 'state', 'kind', 'group')
if h[1] ~= ARGV[3] or terminal(h[2] or 'succeeded') then return 'lost' end
local active = P..'active:'..h[3]..':'..h[4]
if not redis.call('ZSCORE', active, ARGV[2]) then return 'lost' end
redis.call('ZADD', active, tonumber(ARGV[4]) + tonumber(ARGV[5]), ARGV[2])
redis.call('HSET', key, 'updated_at', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', key, 'progress', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', key, 'metrics', ARGV[8]) end
return h[2]
"""
)

# ARGV: prefix, id, holder, state, message, now_s. The holder ends the job (a final state) or
# gives it back ('queued': e.g. its trainer shuts down). Returns 'ok' or 'lost'.
FINISH = (
    PRELUDE
    + """
local id = ARGV[2]
local key = P..'job:'..id
local h = redis.call('HMGET', key, 'holder', 'state', 'kind', 'group', 'seq')
if h[1] ~= ARGV[3] or terminal(h[2] or 'succeeded') then return 'lost' end
local new = ARGV[4]
if new == 'queued' and h[2] == 'cancelling' then new = 'cancelled' end
redis.call('ZREM', P..'active:'..h[3]..':'..h[4], id)
move(id, h[3], h[5], h[2], new)
redis.call('HSET', key, 'state', new, 'holder', '', 'updated_at', ARGV[6], 'message', ARGV[5])
if new == 'queued' then
  redis.call('ZADD', P..'queue:'..h[3]..':'..h[4], h[5], id)
else
  redis.call('HSET', key, 'finished_at', ARGV[6])
  settle(id)
end
return 'ok'
"""
)

# ARGV: prefix, id, now_s, by. Returns the state after the call, or '' for an unknown job.
CANCEL = (
    PRELUDE
    + """
local id = ARGV[2]
local key = P..'job:'..id
local h = redis.call('HMGET', key, 'state', 'kind', 'group', 'seq')
if not h[1] then return '' end
if terminal(h[1]) or h[1] == 'cancelling' then return h[1] end
if h[1] == 'queued' then
  redis.call('ZREM', P..'queue:'..h[2]..':'..h[3], id)
  move(id, h[2], h[4], 'queued', 'cancelled')
  redis.call('HSET', key, 'state', 'cancelled', 'finished_at', ARGV[3], 'updated_at', ARGV[3],
    'message', 'cancelled by '..ARGV[4]..' before it started')
  settle(id)
  return 'cancelled'
end
move(id, h[2], h[4], h[1], 'cancelling')
redis.call('HSET', key, 'state', 'cancelling', 'updated_at', ARGV[3],
  'message', 'cancel requested by '..ARGV[4])
return 'cancelling'
"""
)

# ARGV: prefix, id, holder, reset ('1' empties the list first), items...
APPEND_RESULTS = """
local key = ARGV[1]..'job:'..ARGV[2]
if redis.call('HGET', key, 'holder') ~= ARGV[3] then return -1 end
if ARGV[4] == '1' then redis.call('DEL', key..':results') end
if #ARGV > 4 then return redis.call('RPUSH', key..':results', unpack(ARGV, 5)) end
return redis.call('LLEN', key..':results')
"""
