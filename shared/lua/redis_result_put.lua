-- The Redis result store writes one object, within its size cap: while the new object would not fit, the oldest
-- stored objects are dropped first, and each one's request records when (evicted_at) if the object is one of its
-- current run's: its key's claim token (``{request id}/{token}/...``) is the request's claim, the run that finished
-- it (its ``results``) or stores it now. An orphan of an earlier, fenced run says nothing about the request.
-- The object gets a TTL as a backstop only; the sweeper deletes it on time (redis_result_delete.lua).
-- Which objects to drop is read before the call (RedisResultStore.put): candidates, oldest first, each a stride
-- of KEYS (its object, its request's hash) and its claim token in ARGV. The script drops them in order while the
-- new object does not fit, each only while it is still the oldest other object; a dropped object is marked in the
-- same call. If the order changed or the candidates ran out first, it writes nothing and answers retry (what it
-- dropped stays dropped and marked): the caller reads fresh candidates and calls again.
-- KEYS[1] object key, KEYS[2] order (zset: object key -> put time ms, made strictly increasing), KEYS[3] sizes
-- (hash: object key -> bytes), KEYS[4] bytes in use (counter), then per candidate KEYS[3 + 2j] its object key and
-- KEYS[4 + 2j] its request's hash key (the object key again when the object's key names no request: nothing marked).
-- ARGV[1] the bytes, ARGV[2] cap (bytes), ARGV[3] backstop ttl (s), then ARGV[3 + j] candidate j's claim token.
-- Returns {dropped, 1, used} once the object is written after dropping that many (used: the bytes in use after it),
-- {dropped, 0} to retry (nothing written), or {-1, 0} when the object alone exceeds the cap (nothing written).
local object, order, sizes, used_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FIXED = 4
local data, cap, backstop_ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local function candidate(j) return KEYS[FIXED + 2 * j - 1], KEYS[FIXED + 2 * j], ARGV[3 + j] end

local size = string.len(data)
if size > cap then return {-1, 0} end
local now = now_ms()  -- lib_time.lua
-- an object written again (a retried put) is replaced: its old bytes do not count against it, and it is never
-- the one dropped to make room for itself
local old = tonumber(redis.call('HGET', sizes, object) or '0')
local used = tonumber(redis.call('GET', used_key) or '0')  -- what is stored, the old bytes included
local function oldest_other()
  local two = redis.call('ZRANGE', order, 0, 1)
  if two[1] == object then return two[2] end
  return two[1]
end
local dropped, retry = 0, false
while used - old + size > cap do
  local oldest = oldest_other()
  if not oldest then break end  -- nothing else is stored: it is written all the same
  local victim, request, token = candidate(dropped + 1)
  if victim ~= oldest then  -- the order changed, or the candidates ran out (victim nil)
    retry = true
    break
  end
  used = used - tonumber(redis.call('HGET', sizes, victim) or '0')
  redis.call('DEL', victim)
  redis.call('ZREM', order, victim)
  redis.call('HDEL', sizes, victim)
  if request ~= victim and redis.call('HGET', request, 'claim') == token then
    redis.call('HSET', request, 'evicted_at', now / 1000)
  end
  dropped = dropped + 1
end
if retry then
  if dropped > 0 then redis.call('SET', used_key, used) end
  return {dropped, 0}
end
if old > 0 then redis.call('ZREM', order, object) end  -- a retried put: it was stored (its size is in sizes)
-- scores strictly increase, so puts within one millisecond keep their order (ties would sort by key name)
local score = now
local newest = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 1 end
redis.call('SET', object, data, 'EX', backstop_ttl)
redis.call('ZADD', order, score, object)
redis.call('HSET', sizes, object, size)
redis.call('SET', used_key, used - old + size)
return {dropped, 1, used - old + size}
