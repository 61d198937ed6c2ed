-- A run is about to store result objects under these keys: journal them first, due for deletion after the grace
-- period. finish.lua pushes the due time of a succeeded request's keys to its expiry; keys of a run that never
-- finished (killed after writing, or fenced off as a late writer) fall due and the sweeper deletes their objects.
-- KEYS[1] results journal (zset: key -> due time, Redis server ms). ARGV[1] grace (ms), ARGV[2..] result keys.
-- Returns the number of keys recorded.
local journal, grace_ms = KEYS[1], tonumber(ARGV[1])

local PAGE = 1000  -- keys per ZADD (one ZADD for a batch's keys, not one per key)
local due = now_ms() + grace_ms  -- lib_time.lua
for first = 2, #ARGV, PAGE do
  local members = {}
  for i = first, math.min(first + PAGE - 1, #ARGV) do
    table.insert(members, due)
    table.insert(members, ARGV[i])
  end
  redis.call('ZADD', journal, unpack(members))
end
return #ARGV - 1
