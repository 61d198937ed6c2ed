-- The Redis result store deletes objects and gives their bytes back to its size cap.
-- KEYS[1] order zset, KEYS[2] sizes hash, KEYS[3] bytes in use (counter), KEYS[4..] object keys.
-- Returns how many existed.
local order, sizes, used = KEYS[1], KEYS[2], KEYS[3]
local FIXED = 3

local freed, existed = 0, 0
for i = FIXED + 1, #KEYS do
  local object = KEYS[i]
  freed = freed + tonumber(redis.call('HGET', sizes, object) or '0')
  existed = existed + redis.call('DEL', object)
  redis.call('ZREM', order, object)
  redis.call('HDEL', sizes, object)
end
if freed > 0 then redis.call('DECRBY', used, freed) end
return existed
