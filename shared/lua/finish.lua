-- End one running request, only for the claim that runs it (a late writer from an earlier claim is ignored).
-- A succeeded request's images are already in the result store under the given keys; they must still be in the
-- results journal (recorded at claim time, see results_record.lua), else the sweeper may have deleted them and the
-- request fails with ResultLost. Kept keys become due for deletion with the request (now + ttl); an abort flag wins
-- over success, and then the keys become due at once. What ending it does besides (input images dropped, the event,
-- the webhook outbox, the wake-up, the metrics) is ``end_request``'s (lib_end_request.lua, prepended).
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
end_request(KEYS[1], ARGV[7], status, 'running', ARGV[2], ARGV[3], ARGV[6])  -- lib_end_request.lua
return status
