-- Fail requests that have not finished (any non-terminal status), with one error; finished ones are left alone.
-- What failing a request does is ``fail_request`` (lib_fail_request.lua, prepended): input images dropped, the
-- ``failed`` event, the webhook outbox, the wake-up and the metrics.
-- KEYS request hashes. ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] error type,
-- ARGV[5] error message, ARGV[6..] the request ids (KEYS order). Returns the status of each after the call.
local out = {}
for i = 1, #KEYS do
  local status = redis.call('HGET', KEYS[i], 'status')
  if status == 'queued' or status == 'scheduled' or status == 'running' then
    status = 'failed'
    fail_request(KEYS[i], ARGV[i + 5], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  end
  out[i] = status or 'missing'
end
return out
