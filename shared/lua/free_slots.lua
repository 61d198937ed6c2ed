-- Free worker slots: live workers (a heartbeat within the ttl, by Redis server time; stale ones are swept, with
-- their capabilities) minus batches in flight that occupy a worker: every batch in flight but those whose forward
-- is over while their outputs are stored (forward_done.lua).
-- KEYS[1] workers zset, KEYS[2] inflight zset, KEYS[3] capabilities hash, KEYS[4] storing zset.
-- ARGV[1] worker ttl (ms).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if #stale > 0 then
  redis.call('HDEL', KEYS[3], unpack(stale))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
end
local busy = redis.call('ZCARD', KEYS[2]) - redis.call('ZINTERCARD', 2, KEYS[2], KEYS[4])
return redis.call('ZCARD', KEYS[1]) - busy
