-- The sweeper takes result keys whose objects must be deleted: those in the journal that fell due, and those it
-- took earlier without confirming their deletion (retry). Taken keys leave the journal (so finish.lua refuses them:
-- ResultLost) and wait in the deleting set until the sweeper confirms (ZREM) or the retry time passes.
-- KEYS[1] results journal, KEYS[2] deleting set. ARGV[1] most keys to take, ARGV[2] retry after (ms).
-- Returns the keys taken.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local retry_at = now + tonumber(ARGV[2])
local out = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, key in ipairs(out) do redis.call('ZADD', KEYS[2], retry_at, key) end
if #out < limit then
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - #out)) do
    redis.call('ZREM', KEYS[1], key)
    redis.call('ZADD', KEYS[2], retry_at, key)
    table.insert(out, key)
  end
end
return out
