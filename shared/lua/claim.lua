-- A worker takes a batch: lock it and move the unfinished requests it runs to running under this claim's token.
-- Which ones is split_plan's (lib_split_plan.lua, prepended): all of them, unless runs of the batch were lost (its
-- worker died, was killed at the time limit, or lost Redis), then one half of the lost run, or its one request
-- again, or the part put aside last. A lost request put aside stays running with no claim token (so a late writer
-- from the lost run can finish nothing; abort.lua and expire.lua end it at once), and waits for a later claim of the
-- batch: the reaper publishes the batch again once this run has released it. Each request's lost runs are counted
-- in the batch hash (``lost:{id}``, which orders the parts), those that ran it alone too (``lost_alone:{id}``), and
-- how many requests the last claim that ran something ran (``ran``); one lost max attempts times running alone
-- fails WorkerLost.
-- A request it runs starts its run with no ``evicted_at``: an eviction mark only ever describes the current run's
-- objects (redis_result_put.lua; a dead run's orphan dropped before this claim marked its then current run).
-- Only a claim that runs something counts an attempt (``attempts``, the claims that ran something).
-- A call whose token already holds the lock is a replay (the reply of the first call was lost and the worker
-- retried): it changes nothing, renews the lock and answers what the first call did.
-- Every status change appends its event (``running`` with the worker, or the terminal status, by ``end_request``,
-- lib_end_request.lua) to the request's event stream, and, when the request's webhook subscribed to it, to the
-- webhook outbox (shared/webhooks.py).
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), KEYS[4] batch lock, KEYS[5] batch hash, then one stride per
-- request (``request_keys``).
-- ARGV[1] claim token, ARGV[2] lock ttl (ms), ARGV[3] batch id, ARGV[4] now (s), ARGV[5] worker name,
-- ARGV[6] max attempts, ARGV[7] result ttl (s), ARGV[8] finished channel, then the request ids (KEYS order).
-- Returns {-1, pttl} when another run holds the lock, else {attempts, id1, status1, spec1, id2, ...} with the
-- status each request has after the claim and, for those this claim runs, the spec.
local ending, lock, batch = end_keys(1), KEYS[4], KEYS[5]
local FIXED = 5
local token, lock_ttl_ms, batch_id, now, worker = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local max_attempts, ttl, channel = tonumber(ARGV[6]), ARGV[7], ARGV[8]
local n = request_count(FIXED)
local function request_id(j) return ARGV[8 + j] end

local replay = false
if not redis.call('SET', lock, token, 'NX', 'PX', lock_ttl_ms) then  -- held: by this token (a replay) or another
  replay = redis.call('GET', lock) == token
  if not replay then return {-1, redis.call('PTTL', lock)} end
  redis.call('PEXPIRE', lock, lock_ttl_ms)
end
local function finish(j, status)  -- only a request flagged while running reaches a claim aborted
  end_request(request_at(FIXED, j), ending, request_id(j), status, STATUS.running, now, ttl, channel)
end
local statuses, specs, stored, hooks, evicted, rows_of, rows = {}, {}, {}, {}, {}, {}, {}
for j = 1, n do
  local hash = request_at(FIXED, j).hash
  local st = redis.call('HMGET', hash, 'status', 'batch_id', 'abort', 'spec', 'claim', 'webhook_on', 'evicted_at')
  local status = st[1] or 'missing'
  if replay then
    if status == STATUS.running and st[5] == token then specs[j] = st[4] end
  elseif (status == STATUS.scheduled or status == STATUS.running) and st[2] == batch_id then
    if st[3] then
      status = STATUS.aborted
      finish(j, status)
    else
      stored[j], hooks[j], evicted[j] = st[4], st[6], st[7]
      table.insert(rows_of, j)
      table.insert(rows, {lost = status == STATUS.running and st[5] ~= false and st[5] ~= ''})
    end
  end
  statuses[j] = status
end
-- the batch's counts, one HMGET for the batch: attempts, ran, then each candidate row's lost and lost_alone, then
-- seq (the claim's own counters are then written in one HSET, not incremented one by one)
local fields = {'attempts', 'ran'}
for _, j in ipairs(rows_of) do
  table.insert(fields, 'lost:' .. request_id(j))
  table.insert(fields, 'lost_alone:' .. request_id(j))
end
table.insert(fields, 'seq')
local counts = redis.call('HMGET', batch, unpack(fields))
local seq = tonumber(counts[#fields] or '0')
for r, row in ipairs(rows) do
  row.count, row.alone = tonumber(counts[1 + 2 * r] or '0'), tonumber(counts[2 + 2 * r] or '0')
end
local attempts = tonumber(counts[1] or '0')
if not replay then
  local plan = split_plan(rows, max_attempts, tonumber(counts[2] or nil))
  for r, count in pairs(plan.counts) do
    redis.call('HSET', batch, 'lost:' .. request_id(rows_of[r]), count)
    redis.call('HDEL', request_at(FIXED, rows_of[r]).hash, 'claim')  -- put aside unless run below
  end
  for r, count in pairs(plan.alone) do redis.call('HSET', batch, 'lost_alone:' .. request_id(rows_of[r]), count) end
  for _, r in ipairs(plan.fail) do
    local j = rows_of[r]
    statuses[j] = STATUS.failed
    redis.call('HSET', request_at(FIXED, j).hash, 'error_type', 'WorkerLost', 'error_message',
               'its run killed the worker ' .. plan.alone[r] .. ' times running alone '
               .. '(or its worker was killed at the time limit, or lost Redis, each time)')
    finish(j, STATUS.failed)
  end
  if #plan.run > 0 then
    attempts = attempts + 1
    redis.call('HSET', batch, 'attempts', attempts, 'seq', seq + 1, 'claimed_seq', seq + 1, 'ran', #plan.run)
  end
  for _, r in ipairs(plan.run) do
    local j = rows_of[r]
    local request = request_at(FIXED, j)
    statuses[j] = STATUS.running
    specs[j] = stored[j]
    local event = redis.call('XADD', request.events, '*', 'event', STATUS.running, 'worker', worker)
    -- event_ms: when its last event was appended (progress.lua throttles its progress events from it)
    redis.call('HSET', request.hash, 'status', STATUS.running, 'started_at', now, 'worker', worker, 'step', 0,
               'claim', token, 'event_ms', string.match(event, '^%d+'))
    if evicted[j] then  -- a mark of an earlier run's objects (redis_result_put.lua)
      redis.call('HDEL', request.hash, 'evicted_at')
    end
    -- webhook outbox (shared/webhooks.py): this event, when the request's webhook subscribed to it
    local hook = hooks[j]
    if hook and string.find(hook, ' ' .. STATUS.running .. ' ', 1, true) then
      redis.call('XADD', ending.webhooks, '*', 'id', request_id(j), 'event', STATUS.running, 'entry', event,
                 'worker', worker)
    end
  end
end
local out = {attempts}
for j = 1, n do
  table.insert(out, request_id(j))
  table.insert(out, statuses[j])
  table.insert(out, specs[j] or '')
end
return out
