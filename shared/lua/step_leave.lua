-- Step mode (docs/step_mode.md): requests counted in a worker's running set ended (or were sent to it and will not
-- run in it): their room is free for joiners, so wake the scheduler, and those that ran in it leave its levels hash
-- (preemption's candidates). Only while the set is registered: a set swept with a late heartbeat (free_slots.lua)
-- or dropped is not recreated with a count of its own.
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] events stream, KEYS[4] the worker's levels hash.
-- ARGV[1] worker, ARGV[2] requests that left, ARGV[3] events maxlen, then the ids of those that ran in the set.
-- Returns 1 when counted, 0 when the worker has no registered set.
if #ARGV > 3 then redis.call('HDEL', KEYS[4], unpack(ARGV, 4)) end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[1], -tonumber(ARGV[2]))
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'room_free', 'worker', ARGV[1])
return 1
