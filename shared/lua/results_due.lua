-- The sweeper takes result keys whose objects must be deleted: those in the journal that fell due, and those it
-- took earlier without confirming their deletion (retry). Taken keys leave the journal (so finish.lua refuses them:
-- ResultLost) and wait in the deleting set until the sweeper confirms (ZREM) or the retry time passes.
-- KEYS[1] results journal, KEYS[2] deleting set. ARGV[1] most keys to take, ARGV[2] retry after (ms).
-- Returns the keys taken.
local journal, deleting = KEYS[1], KEYS[2]
local limit, retry_after_ms = tonumber(ARGV[1]), tonumber(ARGV[2])

local now = now_ms()  -- lib_time.lua
local retry_at = now + retry_after_ms
local out = redis.call('ZRANGEBYSCORE', deleting, '-inf', now, 'LIMIT', 0, limit)
for _, key in ipairs(out) do redis.call('ZADD', deleting, retry_at, key) end
if #out < limit then
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', journal, '-inf', now, 'LIMIT', 0, limit - #out)) do
    redis.call('ZREM', journal, key)
    redis.call('ZADD', deleting, retry_at, key)
    table.insert(out, key)
  end
end
return out
