-- The Redis result store writes one object, within its size cap: while the new object would not fit, the oldest
-- stored objects are dropped first, and each one's request records when (evicted_at) if the object is one of its
-- current run's: its key's claim token (``{request id}/{token}/...``) is the request's claim, the run that finished
-- it (its ``results``) or stores it now. An orphan of an earlier, fenced run says nothing about the request.
-- The object gets a TTL as a backstop only; the sweeper deletes it on time (redis_result_delete.lua).
-- KEYS[1] object key, KEYS[2] order (zset: object key -> put time ms, made strictly increasing), KEYS[3] sizes
-- (hash: object key -> bytes), KEYS[4] bytes in use (counter). ARGV[1] the bytes, ARGV[2] cap (bytes),
-- ARGV[3] backstop ttl (s), ARGV[4] object key prefix, ARGV[5] request hash key prefix.
-- Returns the number of objects dropped, or -1 when the object alone exceeds the cap (nothing written).
local size = string.len(ARGV[1])
local cap = tonumber(ARGV[2])
if size > cap then return -1 end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- an object written again (a retried put) is replaced: its old bytes are given back first, and it is never
-- the one dropped to make room for itself
local old = tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or '0')
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('HDEL', KEYS[3], KEYS[1])
local used = tonumber(redis.call('GET', KEYS[4]) or '0') - old
local dropped = 0
while used + size > cap do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest then break end
  used = used - tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('DEL', oldest)
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  local request_id, token = string.match(string.sub(oldest, #ARGV[4] + 1), '^([^/]+)/([^/]+)/')
  if request_id and redis.call('HGET', ARGV[5] .. request_id, 'claim') == token then
    redis.call('HSET', ARGV[5] .. request_id, 'evicted_at', now_ms / 1000)
  end
  dropped = dropped + 1
end
-- scores strictly increase, so puts within one millisecond keep their order (ties would sort by key name)
local score = now_ms
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 1 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('ZADD', KEYS[2], score, KEYS[1])
redis.call('HSET', KEYS[3], KEYS[1], size)
redis.call('SET', KEYS[4], used + size)
return dropped
