-- Library, not a script (shared/keys.py prepends it, after lib_drop_inputs.lua, to every script that ends a request:
-- abort.lua, claim.lua, finish.lua, and fail.lua and expire.lua through lib_fail_request.lua): end one unfinished
-- request with its terminal status (a failure's error_type and error_message already in its hash, or in
-- ``known.fields``). Sets the status and finished_at, drops its input images, gives the hash its TTL, appends the
-- status's event to its event stream (packed: a stream reserves 4 KiB for its entries, so it is copied to
-- ``request.packed``, which keeps only the bytes used, and renamed back over it; entry ids kept, blocked readers
-- served) and, when its webhook subscribed to it, to the webhook outbox (shared/webhooks.py), wakes long polls on the
-- finished channel and counts it in the metrics hash (shared/metrics.py): finished:<status>, a failure's
-- failed:<error type>, an abort's aborted:<the status it had>.
-- request: its keys (``request_keys``); ending: the fleet keys (``end_keys``: metrics, webhooks, inputs).
-- was: the status it had (queued, scheduled or running; an abort counts where it caught the request).
-- known (optional): what the caller already read of the hash, so that it is not read again: {webhook_on = <the
-- field, false when absent>, counted = <INPUT_COUNT_FIELD, false when absent>, error_type = <a failure's>,
-- none_held = <true when its spec needs no input image: drop_inputs' none_held>}, and
-- ``fields`` ({name, value, ...}) to write in the same HSET as the status.
-- tally (optional): an ``ended_tally()`` that collects the wake-ups and metrics of several ended requests, written
-- once by ``flush_ended`` (one PUBLISH of their ids, space-separated, and one HINCRBY per counter, instead of one of
-- each per request); nil: published and counted at once. A finished channel message is one or more request ids,
-- separated by spaces (api/waiter.py). Returns the terminal event's entry id (its ms: the Redis time, ``entry_ms``).
local function ended_tally() return {counts = {}, order = {}, ids = {}} end

local function count_ended(tally, field)
  if not tally.counts[field] then
    tally.counts[field] = 0
    table.insert(tally.order, field)
  end
  tally.counts[field] = tally.counts[field] + 1
end

local function flush_ended(ending, tally, channel)
  if #tally.ids > 0 then redis.call('PUBLISH', channel, table.concat(tally.ids, ' ')) end
  for _, field in ipairs(tally.order) do redis.call('HINCRBY', ending.metrics, field, tally.counts[field]) end
end

local function end_request(request, ending, request_id, status, was, now, ttl, channel, known, tally)
  local hash, events = request.hash, request.events
  local fields = {'status', status, 'finished_at', now}
  for _, value in ipairs(known and known.fields or {}) do table.insert(fields, value) end
  redis.call('HSET', hash, unpack(fields))
  drop_inputs(hash, ending.inputs, known and known.counted, known and known.none_held)  -- lib_drop_inputs.lua, prepended before this library
  redis.call('EXPIRE', hash, ttl)
  local event = redis.call('XADD', events, '*', 'event', status)
  local hook
  if known then hook = known.webhook_on else hook = redis.call('HGET', hash, 'webhook_on') end
  if hook and string.find(hook, ' ' .. status .. ' ', 1, true) then
    redis.call('XADD', ending.webhooks, '*', 'id', request_id, 'event', status, 'entry', event)
  end
  redis.call('COPY', events, request.packed, 'REPLACE')
  redis.call('RENAME', request.packed, events)
  redis.call('EXPIRE', events, ttl)
  local counts = tally or ended_tally()
  table.insert(counts.ids, request_id)
  count_ended(counts, 'finished:' .. status)
  if status == STATUS.failed then
    local error_type = known and known.error_type or redis.call('HGET', hash, 'error_type')
    count_ended(counts, 'failed:' .. error_type)
  end
  if status == STATUS.aborted then count_ended(counts, 'aborted:' .. was) end
  if not tally then flush_ended(ending, counts, channel) end
  return event
end
