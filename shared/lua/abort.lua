-- Abort a request. Not yet running: aborted at once (a queued one's stream entry is deleted too, so it stops
-- counting against the queue length, and its id is added to the scheduler's aborted set, with a wake-up event
-- ``queue_abort`` on P:events: a scheduler that read it already takes the set when woken so and drops it from its
-- memory and its pending list, O(1) each). Running:
-- flagged, the worker ends it; but one put aside by a split re-run (running with no claim token: claim.lua) runs
-- nowhere and is aborted at once. Aborted at once: what ending a request does (``end_request``,
-- lib_end_request.lua, prepended: the ``aborted`` event, the webhook outbox, the wake-up, the metrics).
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), KEYS[4] request stream, KEYS[5] the scheduler's aborted set,
-- KEYS[6] the scheduler's wake-up events, KEYS[7..9] the request's stride (``request_keys``).
-- ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] request id, ARGV[5] the most ids the aborted
-- set holds (max_queue_len; absent: no cap).
-- Returns the status after the call, or false if unknown.
local ending, stream, aborted, wake_ups, request = end_keys(1), KEYS[4], KEYS[5], KEYS[6], request_at(6, 1)
local now, ttl, channel, request_id, most_aborted = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local st = redis.call('HMGET', request.hash, 'status', 'claim')
local status = st[1]
if not status then return false end
if TERMINAL[status] then return status end
redis.call('HSET', request.hash, 'abort', 1)
if status == STATUS.queued or status == STATUS.scheduled or (status == STATUS.running and not st[2]) then
  local entry = redis.call('HGET', request.hash, 'entry')
  if status == STATUS.queued then
    if entry then redis.call('XDEL', stream, entry) end
    -- scheduler/store.py take_aborted; at most ``most_aborted`` ids (none taking them, it would grow with every
    -- abort): a request left out is found by the scheduler's status check of its head window instead
    if not most_aborted or redis.call('SCARD', aborted) < tonumber(most_aborted) then
      redis.call('SADD', aborted, request_id)
      redis.call('EXPIRE', aborted, ttl)  -- no scheduler takes it: it goes ttl s after its last id
      redis.call('XADD', wake_ups, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'type', 'queue_abort')
    end
  end
  end_request(request, ending, request_id, STATUS.aborted, status, now, ttl, channel)  -- lib_end_request.lua
  return STATUS.aborted
end
return status
