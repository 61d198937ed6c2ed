-- Library, not a script (shared/keys.py prepends it, after lib_drop_inputs.lua, to every script that ends a request:
-- abort.lua, claim.lua, finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): end one unfinished
-- request with its terminal status (a failure's error_type and error_message already in its hash). Sets the status
-- and finished_at, drops its input images, gives the hash its TTL, appends the status's event to its event stream
-- (packed: a stream reserves 4 KiB for its entries, so it is copied to ``request.packed``, which keeps only the
-- bytes used, and renamed back over it; entry ids kept, blocked readers served) and, when its webhook subscribed to
-- it, to the webhook outbox (shared/webhooks.py), wakes long polls on the finished channel and counts it in the
-- metrics hash (shared/metrics.py): finished:<status>, a failure's failed:<error type>, an abort's aborted:<the
-- status it had>.
-- request: its keys (``request_keys``); ending: the fleet keys (``end_keys``: metrics, webhooks, inputs).
-- was: the status it had (queued, scheduled or running; an abort counts where it caught the request).
local function end_request(request, ending, request_id, status, was, now, ttl, channel)
  local hash, events = request.hash, request.events
  redis.call('HSET', hash, 'status', status, 'finished_at', now)
  drop_inputs(hash, ending.inputs)  -- lib_drop_inputs.lua, prepended before this library
  redis.call('EXPIRE', hash, ttl)
  local event = redis.call('XADD', events, '*', 'event', status)
  local hook = redis.call('HGET', hash, 'webhook_on')
  if hook and string.find(hook, ' ' .. status .. ' ', 1, true) then
    redis.call('XADD', ending.webhooks, '*', 'id', request_id, 'event', status, 'entry', event)
  end
  redis.call('COPY', events, request.packed, 'REPLACE')
  redis.call('RENAME', request.packed, events)
  redis.call('EXPIRE', events, ttl)
  redis.call('PUBLISH', channel, request_id)
  redis.call('HINCRBY', ending.metrics, 'finished:' .. status, 1)
  if status == STATUS.failed then
    redis.call('HINCRBY', ending.metrics, 'failed:' .. redis.call('HGET', hash, 'error_type'), 1)
  end
  if status == STATUS.aborted then redis.call('HINCRBY', ending.metrics, 'aborted:' .. was, 1) end
end
