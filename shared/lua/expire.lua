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
-- KEYS request hashes. ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] error type,
-- ARGV[5] error message (not started), ARGV[6] error message (running), ARGV[7..] the request ids (KEYS order).
-- Returns each request's status after the call, 'aborting' for one flagged now, 'missing' for an unknown one.
local out = {}
for i = 1, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort', 'claim')
  local status = st[1] or 'missing'
  if status == 'queued' or status == 'scheduled' then
    status = 'failed'
    fail_request(KEYS[i], ARGV[i + 6], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  elseif status == 'running' and not st[2] then
    redis.call('HSET', KEYS[i], 'abort', 1, 'error_type', ARGV[4], 'error_message', ARGV[6])
    if st[3] then
      status = 'aborting'
    else
      status = 'aborted'
      end_request(KEYS[i], ARGV[i + 6], status, 'running', ARGV[1], ARGV[2], ARGV[3])
    end
  end
  out[i] = status
end
return out
