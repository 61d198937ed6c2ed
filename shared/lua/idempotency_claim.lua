-- An Idempotency-Key's submission (api/idempotency.py): the first call with a key claims its record for the request
-- ids it is about to queue; a later call with the same key learns what became of it. The record is a hash:
-- ``fingerprint`` (of the submitted bodies), ``ids`` (space-separated, in submission order), ``state`` (``pending``
-- while its call submits, ``done`` once queued) and ``at`` (when it was claimed, ms of Redis time). It expires
-- ARGV[3] s after the claim.
-- KEYS[1] the record. ARGV[1] the call's fingerprint, ARGV[2] its ids, ARGV[3] the record's ttl (s), ARGV[4] how
-- long a pending record is its claimer's (ms): past it, the claimer is taken for dead.
-- Returns {'claimed'} (the record is this call's: submit), {'done', ids} (queued before: answer those),
-- {'pending', ms} (another call is submitting it: retry after ms), {'stale', ids} (pending past ARGV[4]: the
-- caller finds out whether ids were queued and settles the record, idempotency_settle.lua) or {'conflict'} (the
-- key was used with other bodies).
local record = KEYS[1]
local fingerprint, ids, ttl, window = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = math.floor(now_ms())  -- lib_time.lua

local held = redis.call('HMGET', record, 'fingerprint', 'ids', 'state', 'at')
if not held[1] then
  redis.call('HSET', record, 'fingerprint', fingerprint, 'ids', ids, 'state', 'pending', 'at', now)
  redis.call('EXPIRE', record, ttl)
  return {'claimed'}
end
if held[1] ~= fingerprint then return {'conflict'} end
if held[2] == ids then return {'claimed'} end  -- this call's own claim, retried after a lost reply
if held[3] == 'done' then return {'done', held[2]} end
local left = tonumber(held[4]) + window - now
if left > 0 then return {'pending', tostring(math.ceil(left))} end
return {'stale', held[2]}
