-- Record that a batch is being published again now (Redis server time, and the batch's next ``seq``), for the
-- reaper (see reap.lua). KEYS[1] batch hash. Returns its request ids (space separated), '' when it is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then return '' end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'published_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
           'published_seq', redis.call('HINCRBY', KEYS[1], 'seq', 1))
return redis.call('HGET', KEYS[1], 'ids') or ''
