-- Abort a request. Not yet running: aborted at once (a queued one's stream entry is deleted too, so it stops
-- counting against the queue length, and its id is added to the set ``P:scheduler:aborted``: a scheduler that read
-- it already takes the set each round and drops it from its memory and its pending list, O(1) each). Running:
-- flagged, the worker ends it; but one put aside by a split re-run (running with no claim token: claim.lua) runs
-- nowhere and is aborted at once. Aborted at once: what ending a request does (``end_request``,
-- lib_end_request.lua, prepended: the ``aborted`` event, the webhook outbox, the wake-up, the metrics).
-- KEYS[1] request hash, KEYS[2] request stream (optional). ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished
-- channel, ARGV[4] request id, ARGV[5] the most ids ``P:scheduler:aborted`` holds (max_queue_len; absent: no cap).
-- Returns the status after the call, or false if unknown.
local st = redis.call('HMGET', KEYS[1], 'status', 'claim')
local status = st[1]
if not status then return false end
if status == 'succeeded' or status == 'failed' or status == 'aborted' then return status end
redis.call('HSET', KEYS[1], 'abort', 1)
if status == 'queued' or status == 'scheduled' or (status == 'running' and not st[2]) then
  local entry = redis.call('HGET', KEYS[1], 'entry')
  local prefix, request = string.match(KEYS[1], '^(.*):req:(.*)$')
  if status == 'queued' then
    if KEYS[2] and entry then redis.call('XDEL', KEYS[2], entry) end
    -- scheduler/store.py take_aborted; at most ARGV[5] ids (none taking them, it would grow with every abort): a
    -- request left out is found by the scheduler's status check of its head window instead
    local aborted = prefix .. ':scheduler:aborted'
    if not ARGV[5] or redis.call('SCARD', aborted) < tonumber(ARGV[5]) then
      redis.call('SADD', aborted, request)
      redis.call('EXPIRE', aborted, ARGV[2])  -- no scheduler takes it: it goes ARGV[2] s after its last id
    end
  end
  end_request(KEYS[1], ARGV[4], 'aborted', status, ARGV[1], ARGV[2], ARGV[3])  -- lib_end_request.lua
  return 'aborted'
end
return status
