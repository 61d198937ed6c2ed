-- Abort a request. Not yet running: aborted at once (a queued one's stream entry is deleted too, so it stops
-- counting against the queue length, and its id is added to the set ``P:scheduler:aborted``: a scheduler that read
-- it already takes the set each round and drops it from its memory and its pending list, O(1) each). Running:
-- flagged, the worker ends it. Aborted at once: an ``aborted`` event on its event stream (its hash key .. ':events').
-- A request whose webhook subscribed to the event also gets an entry in the webhook outbox (shared/webhooks.py).
-- KEYS[1] request hash, KEYS[2] request stream (optional). ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished
-- channel, ARGV[4] request id.
-- Returns the status after the call, or false if unknown.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if status == 'succeeded' or status == 'failed' or status == 'aborted' then return status end
redis.call('HSET', KEYS[1], 'abort', 1)
if status == 'queued' or status == 'scheduled' then
  local entry = redis.call('HGET', KEYS[1], 'entry')
  local prefix, request = string.match(KEYS[1], '^(.*):req:(.*)$')
  if status == 'queued' then
    if KEYS[2] and entry then redis.call('XDEL', KEYS[2], entry) end
    redis.call('SADD', prefix .. ':scheduler:aborted', request)  -- scheduler/store.py take_aborted
    redis.call('EXPIRE', prefix .. ':scheduler:aborted', ARGV[2])  -- no scheduler takes it: it goes in time
  end
  redis.call('HSET', KEYS[1], 'status', 'aborted', 'finished_at', ARGV[1])
  drop_inputs(KEYS[1])  -- lib_drop_inputs.lua
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  local event = redis.call('XADD', KEYS[1] .. ':events', '*', 'event', 'aborted')
  -- webhook outbox (shared/webhooks.py): this event, when the request's webhook subscribed to it
  local hook = redis.call('HGET', KEYS[1], 'webhook_on')
  if hook and string.find(hook, ' aborted ', 1, true) then
    redis.call('XADD', prefix .. ':webhooks', '*', 'id', request, 'event', 'aborted', 'entry', event)
  end
  redis.call('COPY', KEYS[1] .. ':events', KEYS[1] .. ':events:packed', 'REPLACE')  -- packed: see shared/keys.py
  redis.call('RENAME', KEYS[1] .. ':events:packed', KEYS[1] .. ':events')
  redis.call('EXPIRE', KEYS[1] .. ':events', ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  local metrics = prefix .. ':metrics'  -- shared/metrics.py
  redis.call('HINCRBY', metrics, 'finished:aborted', 1)
  redis.call('HINCRBY', metrics, 'aborted:' .. status, 1)
  return 'aborted'
end
return status
