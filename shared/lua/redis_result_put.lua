-- The Redis result store writes objects (one, or a batch's: one call for all), within its size cap: while the new
-- objects would not fit, the oldest other stored objects are dropped first, and each one's request records when
-- (evicted_at) if the object is one of its current run's: its key's claim token (``{request id}/{token}/...``) is
-- the request's claim, the run that finished it (its ``results``) or stores it now. An orphan of an earlier, fenced
-- run says nothing about the request. The objects get a TTL as a backstop only; the sweeper deletes them on time
-- (redis_result_delete.lua).
-- Which objects to drop is read before the call (RedisResultStore.put_many): candidates, oldest first, each a
-- stride of KEYS (its object, its request's hash) and its claim token in ARGV. The script drops them in order while
-- the new objects do not fit, each only while it is still the oldest object not being written; a dropped object is
-- marked in the same call. If the order changed or the candidates ran out first, it writes nothing and answers
-- retry (what it dropped stays dropped and marked): the caller reads fresh candidates and calls again.
-- Per call, not per object: one TIME, one HMGET of the old sizes, one INCRBY of the bytes in use (by what the
-- objects add; set again only when objects were dropped, or nothing is written), one ZADD of the order and one HSET
-- of the sizes; per object only its SET.
-- KEYS[1] order (zset: object key -> put time ms, made strictly increasing), KEYS[2] sizes (hash: object key ->
-- bytes), KEYS[3] bytes in use (counter), KEYS[4 .. 3 + n] the n object keys, then per candidate j
-- KEYS[2 + n + 2j] its object key and KEYS[3 + n + 2j] its request's hash key (the object key again when the
-- object's key names no request: nothing marked).
-- ARGV[1] cap (bytes), ARGV[2] backstop ttl (s), ARGV[3] n, ARGV[4 .. 3 + n] the objects' bytes (KEYS order), then
-- ARGV[3 + n + j] candidate j's claim token.
-- Returns {dropped, 1, used} once the objects are written after dropping that many (used: the bytes in use after
-- them), {dropped, 0} to retry (nothing written), or {-1, 0} when the objects together exceed the cap (nothing
-- written).
local order, sizes, used_key = KEYS[1], KEYS[2], KEYS[3]
local FIXED = 3
local cap, backstop_ttl, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local function object_at(i) return KEYS[FIXED + i], ARGV[3 + i] end
local function candidate(j) return KEYS[FIXED + n + 2 * j - 1], KEYS[FIXED + n + 2 * j], ARGV[3 + n + j] end

local objects, own, size = {}, {}, 0
for i = 1, n do
  local object, data = object_at(i)
  objects[i], own[object] = object, true
  size = size + string.len(data)
end
if size > cap then return {-1, 0} end
local now = now_ms()  -- lib_time.lua
-- an object written again (a retried put) is replaced: its old bytes do not count against it, and it is never
-- one dropped to make room for the objects
local old_sizes, old, rewritten = redis.call('HMGET', sizes, unpack(objects)), 0, {}
for i = 1, n do
  local bytes = tonumber(old_sizes[i] or '0')
  if bytes > 0 then table.insert(rewritten, objects[i]) end
  old = old + bytes
end
-- the bytes in use with the objects written (their old bytes off): one INCRBY, put back below if nothing is written
local used = tonumber(redis.call('INCRBY', used_key, size - old))
local function oldest_other()
  for _, stored in ipairs(redis.call('ZRANGE', order, 0, n)) do
    if not own[stored] then return stored end
  end
end
local dropped, retry = 0, false
while used > cap do
  local oldest = oldest_other()
  if not oldest then break end  -- nothing else is stored: they are written all the same
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
  redis.call('SET', used_key, used - size + old)  -- the objects are not written: the dropped ones' bytes only are off
  return {dropped, 0}
end
if #rewritten > 0 then redis.call('ZREM', order, unpack(rewritten)) end  -- a retried put: they were stored
-- scores strictly increase, so puts within one millisecond keep their order (ties would sort by key name)
local score = now
local newest = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 1 end
local scored, sized = {}, {}
for i = 1, n do
  local object, data = object_at(i)
  redis.call('SET', object, data, 'EX', backstop_ttl)
  table.insert(scored, score + i - 1)
  table.insert(scored, object)
  table.insert(sized, object)
  table.insert(sized, string.len(data))
end
redis.call('ZADD', order, unpack(scored))
redis.call('HSET', sizes, unpack(sized))
if dropped > 0 then redis.call('SET', used_key, used) end
return {dropped, 1, used}
