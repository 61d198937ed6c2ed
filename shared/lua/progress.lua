-- Record denoising progress and read, per request, whether its row should stop, in one round trip.
-- KEYS request hashes; ARGV[1] step, ARGV[2] total, ARGV[3] claim token.
-- Returns per key: 0 = go on, 1 = aborted, 2 = no longer this claim's (re-claimed by another run, or ended).
-- A ``progress`` event goes to the request's event stream (its hash key .. ':events') when the step changed and
-- either it is the last step or the stream's last event is EVENT_EVERY_MS old (entry ids are Redis time in ms),
-- trimmed to EVENT_MAXLEN entries: the stream stays small however many steps a request runs.
-- A request whose webhook subscribed to progress also gets an entry in the webhook outbox (shared/webhooks.py) for
-- such an event, at most one per WEBHOOK_EVERY_MS (field webhook_progress_ms), and for the last step.
local EVENT_EVERY_MS, EVENT_MAXLEN, WEBHOOK_EVERY_MS = 250, 64, 1000
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort', 'claim')
  if st[1] ~= 'running' or st[3] ~= ARGV[3] then
    out[i] = 2
  else
    local events, changed = KEYS[i] .. ':events', redis.call('HGET', KEYS[i], 'step') ~= ARGV[1]
    local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)[1]
    if changed and (ARGV[1] == ARGV[2] or not last
                    or now_ms - tonumber(string.match(last[1], '^%d+')) >= EVENT_EVERY_MS) then
      local event = redis.call('XADD', events, 'MAXLEN', EVENT_MAXLEN, '*', 'event', 'progress', 'step', ARGV[1],
                               'total', ARGV[2])
      local hook = redis.call('HMGET', KEYS[i], 'webhook_on', 'webhook_progress_ms')
      if hook[1] and string.find(hook[1], ' progress ', 1, true)
         and (ARGV[1] == ARGV[2] or now_ms - tonumber(hook[2] or '0') >= WEBHOOK_EVERY_MS) then
        redis.call('HSET', KEYS[i], 'webhook_progress_ms', now_ms)
        local prefix, request = string.match(KEYS[i], '^(.*):req:(.*)$')
        redis.call('XADD', prefix .. ':webhooks', '*', 'id', request, 'event', 'progress', 'entry', event,
                   'step', ARGV[1], 'total', ARGV[2])
      end
    end
    redis.call('HSET', KEYS[i], 'step', ARGV[1], 'total', ARGV[2])
    out[i] = st[2] and 1 or 0
  end
end
return out
