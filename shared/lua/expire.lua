-- End requests past their deadline (created_at + timeout_s). The scheduler decides which are past it
-- (scheduler/queue.py for those it holds queued, scheduler/deadlines.py for those in flight); this script only moves
-- a request forward from where it is now:
--   queued or scheduled (not started): failed with error type ARGV[4] (Timeout), by ``fail_request``
--     (lib_fail_request.lua, prepended; as fail.lua does);
--   running: flagged aborted with that error recorded; its worker stops the forward at its next step once every
--     row of it is aborted, and finish.lua (or claim.lua, after a crash) ends it ``aborted``, the error kept;
--     one put aside by a split re-run (running with no claim token: claim.lua) runs nowhere: ended ``aborted`` at
--     once, the error kept, by ``end_request`` (lib_end_request.lua, prepended), as claim.lua would end it later;
--   already flagged, finished or unknown: unchanged.
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), then one stride per request (``request_keys``).
-- ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] error type, ARGV[5] error message (not
-- started), ARGV[6] error message (running), ARGV[7..] the request ids (KEYS order).
-- Returns each request's status after the call, 'aborting' for one flagged now, 'missing' for an unknown one.
local ending = end_keys(1)
local FIXED = 3
local now, ttl, channel, error_type, not_started, ran_past = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local function request_id(j) return ARGV[6 + j] end

local out = {}
for j = 1, request_count(FIXED) do
  local request = request_at(FIXED, j)
  local st = redis.call('HMGET', request.hash, 'status', 'abort', 'claim')
  local status = st[1] or 'missing'
  if status == STATUS.queued or status == STATUS.scheduled then
    status = STATUS.failed
    fail_request(request, ending, request_id(j), now, ttl, channel, error_type, not_started)
  elseif status == STATUS.running and not st[2] then
    redis.call('HSET', request.hash, 'abort', 1, 'error_type', error_type, 'error_message', ran_past)
    if st[3] then
      status = 'aborting'
    else
      status = STATUS.aborted
      end_request(request, ending, request_id(j), status, STATUS.running, now, ttl, channel)
    end
  end
  out[j] = status
end
return out
