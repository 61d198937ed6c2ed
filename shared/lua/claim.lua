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
-- Every status change appends its event (``running`` with the worker, or the terminal status) to the request's
-- event stream (its hash key .. ':events'), which expires with the hash once terminal.
-- A request whose webhook subscribed to the event also gets an entry in the webhook outbox (shared/webhooks.py).
-- KEYS[1] batch lock, KEYS[2] batch hash, KEYS[3..] request hashes.
-- ARGV[1] claim token, ARGV[2] lock ttl (ms), ARGV[3] batch id, ARGV[4] now (s), ARGV[5] worker name,
-- ARGV[6] max attempts, ARGV[7] result ttl (s), ARGV[8] finished channel, then the request ids (KEYS order).
-- Returns {-1, pttl} when another run holds the lock, else {attempts, id1, status1, spec1, id2, ...} with the
-- status each request has after the claim and, for those this claim runs, the spec.
local replay = redis.call('GET', KEYS[1]) == ARGV[1]
if replay then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {-1, redis.call('PTTL', KEYS[1])}
end
local function finish(key, id, status)  -- only a request flagged while running reaches a claim aborted
  end_request(key, id, status, 'running', ARGV[4], ARGV[7], ARGV[8])  -- lib_end_request.lua
end
local statuses, specs, stored, keys, rows = {}, {}, {}, {}, {}
for i = 3, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'batch_id', 'abort', 'spec', 'claim')
  local status = st[1] or 'missing'
  if replay then
    if status == 'running' and st[5] == ARGV[1] then specs[i] = st[4] end
  elseif (status == 'scheduled' or status == 'running') and st[2] == ARGV[3] then
    if st[3] then
      status = 'aborted'
      finish(KEYS[i], ARGV[i + 6], status)
    else
      local count = redis.call('HMGET', KEYS[2], 'lost:' .. ARGV[i + 6], 'lost_alone:' .. ARGV[i + 6])
      stored[i] = st[4]
      table.insert(keys, i)
      table.insert(rows, {lost = status == 'running' and st[5] ~= false and st[5] ~= '',
                          count = tonumber(count[1] or '0'), alone = tonumber(count[2] or '0')})
    end
  end
  statuses[i] = status
end
local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
if not replay then
  local plan = split_plan(rows, tonumber(ARGV[6]), tonumber(redis.call('HGET', KEYS[2], 'ran') or nil))
  for r, count in pairs(plan.counts) do
    redis.call('HSET', KEYS[2], 'lost:' .. ARGV[keys[r] + 6], count)
    redis.call('HDEL', KEYS[keys[r]], 'claim')  -- put aside unless run below: the lost run can finish nothing
  end
  for r, count in pairs(plan.alone) do redis.call('HSET', KEYS[2], 'lost_alone:' .. ARGV[keys[r] + 6], count) end
  for _, r in ipairs(plan.fail) do
    local i = keys[r]
    statuses[i] = 'failed'
    redis.call('HSET', KEYS[i], 'error_type', 'WorkerLost', 'error_message',
               'its run killed the worker ' .. plan.alone[r] .. ' times running alone '
               .. '(or its worker was killed at the time limit, or lost Redis, each time)')
    finish(KEYS[i], ARGV[i + 6], 'failed')
  end
  if #plan.run > 0 then
    attempts = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
    redis.call('HSET', KEYS[2], 'claimed_seq', redis.call('HINCRBY', KEYS[2], 'seq', 1), 'ran', #plan.run)
  end
  for _, r in ipairs(plan.run) do
    local i = keys[r]
    statuses[i] = 'running'
    specs[i] = stored[i]
    redis.call('HSET', KEYS[i], 'status', 'running', 'started_at', ARGV[4], 'worker', ARGV[5], 'step', 0,
               'claim', ARGV[1])
    redis.call('HDEL', KEYS[i], 'evicted_at')  -- a mark of an earlier run's objects (redis_result_put.lua)
    local event = redis.call('XADD', KEYS[i] .. ':events', '*', 'event', 'running', 'worker', ARGV[5])
    -- webhook outbox (shared/webhooks.py): this event, when the request's webhook subscribed to it
    local hook = redis.call('HGET', KEYS[i], 'webhook_on')
    if hook and string.find(hook, ' running ', 1, true) then
      local prefix, request = string.match(KEYS[i], '^(.*):req:(.*)$')
      redis.call('XADD', prefix .. ':webhooks', '*', 'id', request, 'event', 'running', 'entry', event,
                 'worker', ARGV[5])
    end
  end
end
local out = {attempts}
for i = 3, #KEYS do
  table.insert(out, ARGV[i + 6])
  table.insert(out, statuses[i])
  table.insert(out, specs[i] or '')
end
return out
