-- Record denoising progress and read, per request, whether its row should stop, in one round trip.
-- One HMGET per request reads all it needs, and one HSET writes it.
-- A ``progress`` event goes to the request's event stream when the step changed and either it is the last step or
-- the stream's last event is EVENT_EVERY_MS old (field ``event_ms``, the Redis time of the last event: written with
-- the ``running`` event by claim.lua and with each progress event here; without it, as for a request that came
-- running another way, the last entry's id is read once), trimmed to REQUEST_EVENTS_MAXLEN entries: the stream
-- stays small however many steps a request runs.
-- A request whose webhook subscribed to progress also gets an entry in the webhook outbox (shared/webhooks.py) for
-- such an event, at most one per WEBHOOK_EVERY_MS (field webhook_progress_ms), and for the last step.
-- KEYS[1] webhook outbox, then one stride per request (``request_keys``).
-- ARGV[1] step, ARGV[2] total, ARGV[3] claim token, then the request ids (KEYS order).
-- Returns per request: 0 = go on, 1 = aborted, 2 = no longer this claim's (re-claimed by another run, or ended).
local webhooks = KEYS[1]
local FIXED = 1
local step, total, token = ARGV[1], ARGV[2], ARGV[3]
local function request_id(j) return ARGV[3 + j] end
-- the worker writes at most every 250 ms (gpu_worker/step_reporter.py WRITE_EVERY_S): EVENT_EVERY_MS is 50 ms less,
-- so a write a little early by Redis's clock still carries its event (an event every 250 ms, not every 500)
local EVENT_EVERY_MS, WEBHOOK_EVERY_MS = 200, 1000

local now = now_ms()  -- lib_time.lua
local out = {}
for j = 1, request_count(FIXED) do
  local request = request_at(FIXED, j)
  local hash = request.hash
  local st = redis.call('HMGET', hash, 'status', 'abort', 'claim', 'step', 'webhook_on', 'webhook_progress_ms',
                       'event_ms')
  if st[1] ~= STATUS.running or st[3] ~= token then
    out[j] = 2
  else
    local fields = {'step', step, 'total', total}
    local last_ms = tonumber(st[7] or '')
    if st[4] ~= step and not last_ms then
      local last = redis.call('XREVRANGE', request.events, '+', '-', 'COUNT', 1)[1]
      last_ms = last and tonumber(string.match(last[1], '^%d+'))
    end
    if st[4] ~= step and (step == total or not last_ms or now - last_ms >= EVENT_EVERY_MS) then
      local event = redis.call('XADD', request.events, 'MAXLEN', REQUEST_EVENTS_MAXLEN, '*', 'event', 'progress',
                               'step', step, 'total', total)
      table.insert(fields, 'event_ms')
      table.insert(fields, string.match(event, '^%d+'))
      if st[5] and string.find(st[5], ' progress ', 1, true)
         and (step == total or now - tonumber(st[6] or '0') >= WEBHOOK_EVERY_MS) then
        table.insert(fields, 'webhook_progress_ms')
        table.insert(fields, now)
        redis.call('XADD', webhooks, '*', 'id', request_id(j), 'event', 'progress', 'entry', event,
                   'step', step, 'total', total)
      end
    end
    redis.call('HSET', hash, unpack(fields))
    out[j] = st[2] and 1 or 0
  end
end
return out
