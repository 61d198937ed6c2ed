-- The Redis result store deletes objects and gives their bytes back to its size cap.
-- KEYS[1] order zset, KEYS[2] sizes hash, KEYS[3] bytes in use, KEYS[4..] object keys. Returns how many existed.
local freed, existed = 0, 0
for i = 4, #KEYS do
  freed = freed + tonumber(redis.call('HGET', KEYS[2], KEYS[i]) or '0')
  existed = existed + redis.call('DEL', KEYS[i])
  redis.call('ZREM', KEYS[1], KEYS[i])
  redis.call('HDEL', KEYS[2], KEYS[i])
end
if freed > 0 then redis.call('DECRBY', KEYS[3], freed) end
return existed
