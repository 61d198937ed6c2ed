-- A run of a batch is over: drop its lock (if still ours) and, once no request of the batch is left unfinished
-- and no other run holds it, take the batch out of flight (its hash then expires) and wake the scheduler.
-- A batch with unfinished requests stays in flight: the reaper publishes it again.
-- Unless another run holds the batch, it no longer stores behind a forward (forward_done.lua): it leaves the storing
-- zset, whether this run's lock was still there or had lapsed (a run that lost its lock must not leave a member that
-- frees a slot for no run), but for a batch published again since its last claim (it may wait in a step-mode set's
-- inbox, step_join.lua: there it is the set that holds the slot), which leaves it once taken out of flight.
-- KEYS[1] batch lock, KEYS[2] inflight, KEYS[3] events, KEYS[4] batch hash, KEYS[5] storing zset.
-- ARGV[1] claim token, ARGV[2] batch id, ARGV[3] events maxlen, ARGV[4] key prefix, ARGV[5] ttl (s).
-- Returns 1 when the batch left flight, 0 when it stays.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local st = redis.call('HMGET', KEYS[4], 'ids', 'claimed_seq', 'published_seq')
if tonumber(st[2] or '0') >= tonumber(st[3] or '0') then redis.call('ZREM', KEYS[5], ARGV[2]) end
for id in string.gmatch(st[1] or '', '%S+') do
  local req = redis.call('HMGET', ARGV[4] .. ':req:' .. id, 'status', 'batch_id')
  if (req[1] == 'scheduled' or req[1] == 'running') and req[2] == ARGV[2] then return 0 end
end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'batch_done', 'batch_id', ARGV[2])
return 1
