-- A worker takes a batch: lock it and move its unfinished requests to running under this claim's token.
-- Only a claim that finds something to run counts an attempt; past max attempts those requests fail instead.
-- A call whose token already holds the lock is a replay (the reply of the first call was lost and the worker
-- retried): it changes nothing, renews the lock and answers what the first call did.
-- KEYS[1] batch lock, KEYS[2] batch hash, KEYS[3..] request hashes.
-- ARGV[1] claim token, ARGV[2] lock ttl (ms), ARGV[3] batch id, ARGV[4] now (s), ARGV[5] worker name,
-- ARGV[6] max attempts, ARGV[7] result ttl (s), ARGV[8] finished channel, then the request ids (KEYS order).
-- Returns {-1, pttl} when another run holds the lock, else {attempts, id1, status1, spec1, id2, ...} with the
-- status each request has after the claim (running = this claim runs it) and, for running ones, the spec.
local replay = redis.call('GET', KEYS[1]) == ARGV[1]
if replay then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {-1, redis.call('PTTL', KEYS[1])}
end
local function finish(key, id, status)
  redis.call('HSET', key, 'status', status, 'finished_at', ARGV[4])
  redis.call('HDEL', key, 'input_image', 'input_mask')
  redis.call('EXPIRE', key, ARGV[7])
  redis.call('PUBLISH', ARGV[8], id)
end
local statuses, specs, runnable = {}, {}, {}
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
      table.insert(runnable, i)
      specs[i] = st[4]
    end
  end
  statuses[i] = status
end
local attempts = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')
if #runnable > 0 then
  attempts = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
  redis.call('HSET', KEYS[2], 'claimed_seq', redis.call('HINCRBY', KEYS[2], 'seq', 1))
end
for _, i in ipairs(runnable) do
  if attempts > tonumber(ARGV[6]) then
    statuses[i] = 'failed'
    specs[i] = ''
    redis.call('HSET', KEYS[i], 'error_type', 'WorkerLost', 'error_message',
               'the batch was claimed ' .. (attempts - 1) .. ' times without finishing '
               .. '(its worker died, was killed at the time limit, or lost Redis)')
    finish(KEYS[i], ARGV[i + 6], 'failed')
  else
    statuses[i] = 'running'
    redis.call('HSET', KEYS[i], 'status', 'running', 'started_at', ARGV[4], 'worker', ARGV[5], 'step', 0,
               'claim', ARGV[1])
  end
end
local out = {attempts}
for i = 3, #KEYS do
  table.insert(out, ARGV[i + 6])
  table.insert(out, statuses[i])
  table.insert(out, specs[i] or '')
end
return out
