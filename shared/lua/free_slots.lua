-- Free worker slots: live workers (a heartbeat within the ttl, by Redis server time; stale ones are swept, with
-- their capabilities and step-mode sets) minus what occupies a worker: every batch in flight but those in the
-- storing zset (their forward is over while their outputs are stored, forward_done.lua; or they run in a step-mode
-- set, step_join.lua), plus every open step-mode set (it holds its worker's slot while rows join and leave).
-- KEYS[1] workers zset, KEYS[2] inflight zset, KEYS[3] capabilities hash, KEYS[4] storing zset,
-- KEYS[5] step sets hash, KEYS[6] step rows hash.
-- ARGV[1] worker ttl (ms).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if #stale > 0 then
  redis.call('HDEL', KEYS[3], unpack(stale))
  redis.call('HDEL', KEYS[5], unpack(stale))
  redis.call('HDEL', KEYS[6], unpack(stale))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
end
local busy = redis.call('ZCARD', KEYS[2]) - redis.call('ZINTERCARD', 2, KEYS[2], KEYS[4]) + redis.call('HLEN', KEYS[5])
return redis.call('ZCARD', KEYS[1]) - busy
