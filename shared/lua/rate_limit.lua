-- Take ``cost`` tokens from an API key's token bucket, or say how long until they are there (nothing is taken).
-- The bucket holds at most ``burst`` tokens and refills at ``rate`` tokens per second, by Redis server time, so
-- it holds across any number of api processes. A new (or expired) bucket is full. The bucket expires once it
-- would be full again, so an idle key leaves nothing behind.
-- KEYS[1] the key's bucket hash (fields ``tokens``, ``at_ms``).
-- ARGV[1] rate (tokens per second, > 0), ARGV[2] burst (>= 1), ARGV[3] cost (1 <= cost <= burst: the caller
-- refuses a larger one outright).
-- Returns 0 when the tokens were taken, else the milliseconds to wait before they would be (>= 1).
local bucket = KEYS[1]
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local now = now_ms()  -- lib_time.lua
local held = redis.call('HMGET', bucket, 'tokens', 'at_ms')
local tokens = tonumber(held[1]) or burst
local at = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
if tokens < cost then
  return math.max(1, math.ceil((cost - tokens) * 1000 / rate))
end
tokens = tokens - cost
redis.call('HSET', bucket, 'tokens', string.format('%.6f', tokens), 'at_ms', now)
redis.call('PEXPIRE', bucket, math.ceil((burst - tokens) * 1000 / rate) + 1000)
return 0
