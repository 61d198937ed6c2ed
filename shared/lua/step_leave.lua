-- Step mode (docs/step_mode.md): requests counted in a worker's running set ended (or were sent to it and will not
-- run in it): their room is free for joiners, so wake the scheduler, and those that ran in it leave its levels hash
-- (preemption's candidates). Only while the set is registered: a set swept with a late heartbeat (free_slots.lua)
-- or dropped is not recreated with a count of its own.
-- Idempotent: each count-out carries a token of its own, kept as the worker's last one (its loop counts out one at
-- a time, and retries a call whose reply was lost before making the next), so a retry is not counted twice (the
-- set would take joiners past max_num_seqs).
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] events stream, KEYS[4] the worker's levels hash,
-- KEYS[5] the worker's last count-out token.
-- ARGV[1] worker, ARGV[2] requests that left, ARGV[3] events maxlen, ARGV[4] this count-out's token,
-- ARGV[5] the token's ttl (s), then the ids of those that ran in the set.
-- Returns 1 when counted (or already counted), 0 when the worker has no registered set.
if redis.call('GET', KEYS[5]) == ARGV[4] then return 1 end
if #ARGV > 5 then redis.call('HDEL', KEYS[4], unpack(ARGV, 6)) end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[1], -tonumber(ARGV[2]))
redis.call('SET', KEYS[5], ARGV[4], 'EX', ARGV[5])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'room_free', 'worker', ARGV[1])
return 1
