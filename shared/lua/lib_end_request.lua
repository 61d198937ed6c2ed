-- Library, not a script (shared/keys.py prepends it, after lib_drop_inputs.lua, to every script that ends a request:
-- abort.lua, claim.lua, finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): end one unfinished
-- request with its terminal status (a failure's error_type and error_message already in its hash). Sets the status
-- and finished_at, drops its input images, gives the hash its TTL, appends the status's event to its event stream
-- (its hash key .. ':events', packed: see shared/keys.py) and, when its webhook subscribed to it, to the webhook
-- outbox (shared/webhooks.py), wakes long polls on the finished channel and counts it in the metrics hash
-- (shared/metrics.py): finished:<status>, a failure's failed:<error type>, an abort's aborted:<the status it had>.
-- was: the status it had (queued, scheduled or running; an abort counts where it caught the request).
local function end_request(hash, request_id, status, was, now, ttl, channel)
  redis.call('HSET', hash, 'status', status, 'finished_at', now)
  drop_inputs(hash)  -- lib_drop_inputs.lua, prepended before this library
  redis.call('EXPIRE', hash, ttl)
  local prefix = string.match(hash, '^(.*):req:')
  local event = redis.call('XADD', hash .. ':events', '*', 'event', status)
  local hook = redis.call('HGET', hash, 'webhook_on')
  if hook and string.find(hook, ' ' .. status .. ' ', 1, true) then
    redis.call('XADD', prefix .. ':webhooks', '*', 'id', request_id, 'event', status, 'entry', event)
  end
  redis.call('COPY', hash .. ':events', hash .. ':events:packed', 'REPLACE')
  redis.call('RENAME', hash .. ':events:packed', hash .. ':events')
  redis.call('EXPIRE', hash .. ':events', ttl)
  redis.call('PUBLISH', channel, request_id)
  local metrics = prefix .. ':metrics'
  redis.call('HINCRBY', metrics, 'finished:' .. status, 1)
  if status == 'failed' then
    redis.call('HINCRBY', metrics, 'failed:' .. redis.call('HGET', hash, 'error_type'), 1)
  end
  if status == 'aborted' then redis.call('HINCRBY', metrics, 'aborted:' .. was, 1) end
end
