-- Fail requests that have not finished (any non-terminal status), with one error; finished ones are left alone.
-- A failed request's input images are dropped (nothing needs them).
-- KEYS request hashes. ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] error type,
-- ARGV[5] error message, ARGV[6..] the request ids (KEYS order). Returns the status of each after the call.
local out = {}
for i = 1, #KEYS do
  local status = redis.call('HGET', KEYS[i], 'status')
  if status == 'queued' or status == 'scheduled' or status == 'running' then
    status = 'failed'
    redis.call('HSET', KEYS[i], 'status', status, 'finished_at', ARGV[1], 'error_type', ARGV[4],
               'error_message', ARGV[5])
    redis.call('HDEL', KEYS[i], 'input_image', 'input_mask')
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    redis.call('PUBLISH', ARGV[3], ARGV[i + 5])
  end
  out[i] = status or 'missing'
end
return out
