-- A run of a batch is over: drop its lock (if still ours) and, once no request of the batch is left unfinished
-- and no other run holds it, take the batch out of flight (its hash then expires) and wake the scheduler.
-- A batch with unfinished requests stays in flight: the reaper publishes it again.
-- Either way the batch no longer stores behind a forward (forward_done.lua).
-- KEYS[1] batch lock, KEYS[2] inflight, KEYS[3] events, KEYS[4] batch hash, KEYS[5] storing zset.
-- ARGV[1] claim token, ARGV[2] batch id, ARGV[3] events maxlen, ARGV[4] key prefix, ARGV[5] ttl (s).
-- Returns 1 when the batch left flight, 0 when it stays.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[5], ARGV[2])
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ids = redis.call('HGET', KEYS[4], 'ids') or ''
for id in string.gmatch(ids, '%S+') do
  local st = redis.call('HMGET', ARGV[4] .. ':req:' .. id, 'status', 'batch_id')
  if (st[1] == 'scheduled' or st[1] == 'running') and st[2] == ARGV[2] then return 0 end
end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'batch_done', 'batch_id', ARGV[2])
return 1
