-- Record that a batch is being published again now (Redis server time), for the reaper's claim timeout.
-- KEYS[1] batch hash. Returns 1 when the batch exists, 0 when its hash is gone (nothing to publish).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'published_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return 1
