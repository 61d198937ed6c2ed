-- Record that a batch is being published again now (Redis server time, and the batch's next ``seq``), for the
-- reaper (see reap.lua).
-- KEYS[1] batch hash.
-- Returns its request ids (space separated), '' when it is gone.
local batch = KEYS[1]

if redis.call('EXISTS', batch) == 0 then return '' end
redis.call('HSET', batch, 'published_ms', now_ms(), 'published_seq', redis.call('HINCRBY', batch, 'seq', 1))
return redis.call('HGET', batch, 'ids') or ''
