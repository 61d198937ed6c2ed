-- Free worker slots: live workers (a heartbeat within the ttl, by Redis server time; stale ones are swept)
-- minus batches in flight. KEYS[1] workers zset, KEYS[2] inflight zset. ARGV[1] worker ttl (ms).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
return redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])
