-- Settle an Idempotency-Key's record (idempotency_claim.lua) that holds ids ARGV[1], the caller's claim: ``done``
-- (its requests were queued: a later call with the key answers them), ``release`` (nothing was queued: the record
-- goes, and the key may be used again), or ``take`` (a stale claim whose ids were never queued: the record becomes
-- the caller's, pending for ids ARGV[3] from now, and expires ARGV[4] s from now).
-- KEYS[1] the record. ARGV[1] the ids it must hold, ARGV[2] done | release | take, ARGV[3] the new ids (take),
-- ARGV[4] the record's ttl (s; take).
-- Returns 1 when settled, 0 when the record no longer holds ARGV[1] (it expired, or another call took it over), or
-- for a take, when its call settled it meanwhile.
local record = KEYS[1]
local held_ids, action, new_ids, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local held = redis.call('HMGET', record, 'ids', 'state')
if action == 'take' and held[1] == new_ids then return 1 end  -- this take, retried after a lost reply
if held[1] ~= held_ids then return 0 end
if action == 'take' and held[2] ~= 'pending' then return 0 end  -- its call settled it meanwhile: not stale
if action == 'done' then
  redis.call('HSET', record, 'state', 'done')
elseif action == 'release' then
  redis.call('DEL', record)
else
  redis.call('HSET', record, 'ids', new_ids, 'state', 'pending', 'at', math.floor(now_ms()))
  redis.call('EXPIRE', record, ttl)
end
return 1
