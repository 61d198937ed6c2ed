-- A worker adds to the fleet's metrics (shared/metrics.py): each field of the metrics hash by its increment, and
-- its images to this second's slot of the throughput ring (Redis time, so host clocks do not matter; a slot
-- holding an older second starts again from zero).
-- KEYS[1] metrics hash, KEYS[2] throughput ring. ARGV[1] images for the ring (0 = none), ARGV[2] ring slots,
-- then pairs of field, increment (HINCRBYFLOAT).
for i = 3, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
local images = tonumber(ARGV[1])
if images > 0 then
  local second = tonumber(redis.call('TIME')[1])
  local slot = tostring(second % tonumber(ARGV[2]))
  local held = redis.call('HGET', KEYS[2], slot)
  local count = images
  if held and tonumber(string.match(held, '^(%d+)')) == second then
    count = count + tonumber(string.match(held, ' (%d+)$'))
  end
  redis.call('HSET', KEYS[2], slot, second .. ' ' .. count)
end
return 1
