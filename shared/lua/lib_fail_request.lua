-- Library, not a script (shared/keys.py prepends it to fail.lua and expire.lua): end one unfinished request
-- ``failed`` with an error. Sets the status and error fields, drops its input images, gives the hash its TTL,
-- appends the ``failed`` event to its event stream (its hash key .. ':events', packed: see shared/keys.py) and,
-- when its webhook subscribed to it, to the webhook outbox (shared/webhooks.py), wakes long polls on the finished
-- channel and counts it in the metrics hash (shared/metrics.py).
local function fail_request(hash, request_id, now, ttl, channel, error_type, message)
  redis.call('HSET', hash, 'status', 'failed', 'finished_at', now, 'error_type', error_type, 'error_message', message)
  drop_inputs(hash)  -- lib_drop_inputs.lua, prepended before this library
  redis.call('EXPIRE', hash, ttl)
  local event = redis.call('XADD', hash .. ':events', '*', 'event', 'failed')
  local hook = redis.call('HGET', hash, 'webhook_on')
  if hook and string.find(hook, ' failed ', 1, true) then
    local prefix, request = string.match(hash, '^(.*):req:(.*)$')
    redis.call('XADD', prefix .. ':webhooks', '*', 'id', request, 'event', 'failed', 'entry', event)
  end
  redis.call('COPY', hash .. ':events', hash .. ':events:packed', 'REPLACE')
  redis.call('RENAME', hash .. ':events:packed', hash .. ':events')
  redis.call('EXPIRE', hash .. ':events', ttl)
  redis.call('PUBLISH', channel, request_id)
  local metrics = string.match(hash, '^(.*):req:') .. ':metrics'
  redis.call('HINCRBY', metrics, 'finished:failed', 1)
  redis.call('HINCRBY', metrics, 'failed:' .. error_type, 1)
end
