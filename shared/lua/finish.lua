-- End one running request, only for the claim that runs it (a late writer from an earlier claim is ignored).
-- A succeeded request's images are already in the result store under the given keys; they must still be in the
-- results journal (recorded at claim time, see results_record.lua), else the sweeper may have deleted them and the
-- request fails with ResultLost. Kept keys become due for deletion with the request (now + ttl); an abort flag wins
-- over success, and then the keys become due at once. Input images are dropped from the hash: nothing needs them.
-- The terminal status is appended to the request's event stream (its hash key .. ':events'), expiring with it.
-- A request whose webhook subscribed to the event also gets an entry in the webhook outbox (shared/webhooks.py).
-- KEYS[1] request hash, KEYS[2] results journal. ARGV[1] outcome (succeeded|failed), ARGV[2] now (s),
-- ARGV[3] ttl (s), ARGV[4] error type, ARGV[5] error message, ARGV[6] finished channel, ARGV[7] request id,
-- ARGV[8] claim token, ARGV[9..] result keys of its images (in image order).
-- Returns the status after the call (unchanged when the request is not running under this claim).
local st = redis.call('HMGET', KEYS[1], 'status', 'abort', 'claim')
if st[1] ~= 'running' or st[3] ~= ARGV[8] then return st[1] or 'missing' end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local status, error_type, error_message = ARGV[1], ARGV[4], ARGV[5]
local results = {}
for i = 9, #ARGV do table.insert(results, ARGV[i]) end
if st[2] then status = 'aborted' end
if status == 'succeeded' then
  for _, key in ipairs(results) do
    if not redis.call('ZSCORE', KEYS[2], key) then
      status, error_type = 'failed', 'ResultLost'
      error_message = 'its image ' .. key .. ' was swept from the result store before the run finished '
        .. '(the run outlasted result_orphan_grace_s)'
      break
    end
  end
end
if status == 'succeeded' then
  for _, key in ipairs(results) do redis.call('ZADD', KEYS[2], 'XX', now_ms + tonumber(ARGV[3]) * 1000, key) end
  redis.call('HSET', KEYS[1], 'images', #results, 'results', table.concat(results, ' '))
else
  for _, key in ipairs(results) do redis.call('ZADD', KEYS[2], 'XX', now_ms, key) end
  if status == 'failed' then
    redis.call('HSET', KEYS[1], 'error_type', error_type, 'error_message', error_message)
  end
end
redis.call('HSET', KEYS[1], 'status', status, 'finished_at', ARGV[2])
drop_inputs(KEYS[1])  -- lib_drop_inputs.lua
redis.call('EXPIRE', KEYS[1], ARGV[3])
local event = redis.call('XADD', KEYS[1] .. ':events', '*', 'event', status)
-- webhook outbox (shared/webhooks.py): this event, when the request's webhook subscribed to it
local hook = redis.call('HGET', KEYS[1], 'webhook_on')
if hook and string.find(hook, ' ' .. status .. ' ', 1, true) then
  local prefix, request = string.match(KEYS[1], '^(.*):req:(.*)$')
  redis.call('XADD', prefix .. ':webhooks', '*', 'id', request, 'event', status, 'entry', event)
end
redis.call('COPY', KEYS[1] .. ':events', KEYS[1] .. ':events:packed', 'REPLACE')  -- packed: see shared/keys.py
redis.call('RENAME', KEYS[1] .. ':events:packed', KEYS[1] .. ':events')
redis.call('EXPIRE', KEYS[1] .. ':events', ARGV[3])
redis.call('PUBLISH', ARGV[6], ARGV[7])
-- metrics (shared/metrics.py): the terminal status, a failure's type, an abort that caught the request running
local metrics = string.match(KEYS[1], '^(.*):req:') .. ':metrics'
redis.call('HINCRBY', metrics, 'finished:' .. status, 1)
if status == 'failed' then redis.call('HINCRBY', metrics, 'failed:' .. error_type, 1) end
if status == 'aborted' then redis.call('HINCRBY', metrics, 'aborted:running', 1) end
return status
