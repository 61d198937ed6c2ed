-- The Redis result store writes one object, within its size cap: while the new object would not fit, the oldest
-- stored objects are dropped first, and each one's request records when (evicted_at) if the object is one of its
-- current run's: its key's claim token (``{request id}/{token}/...``) is the request's claim, the run that finished
-- it (its ``results``) or stores it now. An orphan of an earlier, fenced run says nothing about the request.
-- The object gets a TTL as a backstop only; the sweeper deletes it on time (redis_result_delete.lua).
-- Which objects are dropped is only known here, so the request hash of each is named from the object's own key
-- (ARGV[4], ARGV[5]): the one script that names keys it was not given (the Redis result store is one node's).
-- KEYS[1] object key, KEYS[2] order (zset: object key -> put time ms, made strictly increasing), KEYS[3] sizes
-- (hash: object key -> bytes), KEYS[4] bytes in use (counter).
-- ARGV[1] the bytes, ARGV[2] cap (bytes), ARGV[3] backstop ttl (s), ARGV[4] object key prefix (``RedisKeys.result``
-- of ''), ARGV[5] request hash key prefix (``RedisKeys.request`` of '').
-- Returns the number of objects dropped, or -1 when the object alone exceeds the cap (nothing written).
local object, order, sizes, used_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local data, cap, backstop_ttl, object_prefix, request_prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

local size = string.len(data)
if size > cap then return -1 end
local now = now_ms()  -- lib_time.lua
-- an object written again (a retried put) is replaced: its old bytes are given back first, and it is never
-- the one dropped to make room for itself
local old = tonumber(redis.call('HGET', sizes, object) or '0')
redis.call('ZREM', order, object)
redis.call('HDEL', sizes, object)
local used = tonumber(redis.call('GET', used_key) or '0') - old
local dropped = 0
while used + size > cap do
  local oldest = redis.call('ZRANGE', order, 0, 0)[1]
  if not oldest then break end
  used = used - tonumber(redis.call('HGET', sizes, oldest) or '0')
  redis.call('DEL', oldest)
  redis.call('ZREM', order, oldest)
  redis.call('HDEL', sizes, oldest)
  local request_id, token = string.match(string.sub(oldest, #object_prefix + 1), '^([^/]+)/([^/]+)/')
  if request_id and redis.call('HGET', request_prefix .. request_id, 'claim') == token then
    redis.call('HSET', request_prefix .. request_id, 'evicted_at', now / 1000)
  end
  dropped = dropped + 1
end
-- scores strictly increase, so puts within one millisecond keep their order (ties would sort by key name)
local score = now
local newest = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 1 end
redis.call('SET', object, data, 'EX', backstop_ttl)
redis.call('ZADD', order, score, object)
redis.call('HSET', sizes, object, size)
redis.call('SET', used_key, used + size)
return dropped
