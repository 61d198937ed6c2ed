-- End one running request, only for the claim that runs it (a late writer from an earlier claim is ignored).
-- A succeeded request's images are already in the result store under the given keys; they must still be in the
-- results journal (recorded at claim time, see results_record.lua), else the sweeper may have deleted them and the
-- request fails with ResultLost. Kept keys become due for deletion with the request (now + ttl); an abort flag wins
-- over success, and then the keys become due at once. What ending it does besides (input images dropped, the event,
-- the webhook outbox, the wake-up, the metrics) is ``end_request``'s (lib_end_request.lua, prepended).
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), KEYS[4] results journal, KEYS[5..7] the request's stride
-- (``request_keys``).
-- ARGV[1] outcome (succeeded|failed), ARGV[2] now (s), ARGV[3] ttl (s), ARGV[4] error type, ARGV[5] error message,
-- ARGV[6] finished channel, ARGV[7] request id, ARGV[8] claim token, ARGV[9..] result keys of its images (in
-- image order).
-- Returns the status after the call (unchanged when the request is not running under this claim).
local ending, journal, request = end_keys(1), KEYS[4], request_at(4, 1)
local outcome, now, ttl, error_type, error_message = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local channel, request_id, token = ARGV[6], ARGV[7], ARGV[8]
local results = {}
for i = 9, #ARGV do table.insert(results, ARGV[i]) end

local st = redis.call('HMGET', request.hash, 'status', 'abort', 'claim')
if st[1] ~= STATUS.running or st[3] ~= token then return st[1] or 'missing' end
local now_in_ms = now_ms()  -- lib_time.lua
local status = outcome
if st[2] then status = STATUS.aborted end
if status == STATUS.succeeded then
  for _, key in ipairs(results) do
    if not redis.call('ZSCORE', journal, key) then
      status, error_type = STATUS.failed, 'ResultLost'
      error_message = 'its image ' .. key .. ' was swept from the result store before the run finished '
        .. '(the run outlasted result_orphan_grace_s)'
      break
    end
  end
end
if status == STATUS.succeeded then
  for _, key in ipairs(results) do redis.call('ZADD', journal, 'XX', now_in_ms + tonumber(ttl) * 1000, key) end
  redis.call('HSET', request.hash, 'images', #results, 'results', table.concat(results, ' '))
else
  for _, key in ipairs(results) do redis.call('ZADD', journal, 'XX', now_in_ms, key) end
  if status == STATUS.failed then
    redis.call('HSET', request.hash, 'error_type', error_type, 'error_message', error_message)
  end
end
end_request(request, ending, request_id, status, STATUS.running, now, ttl, channel)  -- lib_end_request.lua
return status
