-- Fail requests that have not finished (any non-terminal status), with one error; finished ones are left alone.
-- What failing a request does is ``fail_request`` (lib_fail_request.lua, prepended): input images dropped, the
-- ``failed`` event, the webhook outbox, the wake-up and the metrics.
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), then one stride per request (``request_keys``).
-- ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] error type, ARGV[5] error message,
-- ARGV[6..] the request ids (KEYS order).
-- Returns the status of each after the call ('missing' for an unknown one).
local ending = end_keys(1)
local FIXED = 3
local now, ttl, channel, error_type, error_message = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local function request_id(j) return ARGV[5 + j] end

local out = {}
for j = 1, request_count(FIXED) do
  local request = request_at(FIXED, j)
  local status = redis.call('HGET', request.hash, 'status')
  if status and not TERMINAL[status] then
    status = STATUS.failed
    fail_request(request, ending, request_id(j), now, ttl, channel, error_type, error_message)
  end
  out[j] = status or 'missing'
end
return out
