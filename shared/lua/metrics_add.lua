-- A worker adds to the fleet's metrics (shared/metrics.py): each field of the metrics hash by its increment, and
-- its images to this second's slot of the throughput ring (Redis time, so host clocks do not matter; a slot
-- holding an older second starts again from zero).
-- KEYS[1] metrics hash, KEYS[2] throughput ring hash.
-- ARGV[1] images for the ring (0 = none), ARGV[2] ring slots, then pairs of field, increment (HINCRBYFLOAT).
-- Returns 1.
local metrics, ring = KEYS[1], KEYS[2]
local images, slots = tonumber(ARGV[1]), tonumber(ARGV[2])

for i = 3, #ARGV, 2 do redis.call('HINCRBYFLOAT', metrics, ARGV[i], ARGV[i + 1]) end
if images > 0 then
  local second = now_s()  -- lib_time.lua
  local slot = tostring(second % slots)
  local held = redis.call('HGET', ring, slot)
  local count = images
  if held and tonumber(string.match(held, '^(%d+)')) == second then
    count = count + tonumber(string.match(held, ' (%d+)$'))
  end
  redis.call('HSET', ring, slot, second .. ' ' .. count)
end
return 1
