-- Library, not a script (shared/keys.py prepends it, after lib_end_request.lua, to fail.lua and expire.lua): end one
-- unfinished request ``failed`` with an error: its error fields, then what ending any request does
-- (``end_request``: input images dropped, the ``failed`` event, the webhook outbox, the wake-up and the metrics).
local function fail_request(request, ending, request_id, now, ttl, channel, error_type, message)
  redis.call('HSET', request.hash, 'error_type', error_type, 'error_message', message)
  end_request(request, ending, request_id, STATUS.failed, nil, now, ttl, channel)  -- lib_end_request.lua
end
