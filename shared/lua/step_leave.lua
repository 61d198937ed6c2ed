-- Step mode (docs/step_mode.md): requests counted in a worker's running set ended (or were sent to it and will not
-- run in it): their room is free for joiners, so wake the scheduler, and those that ran in it leave its levels hash
-- (preemption's candidates). Only while the set is registered: a set swept with a late heartbeat (free_slots.lua)
-- or dropped is not recreated with a count of its own (step_reregister.lua registers a swept one again).
-- Idempotent: each count-out carries a token of its own, kept as the worker's last one (its loop counts out one at
-- a time, and retries a call whose reply was lost before making the next), so a retry is not counted twice (the
-- set would take joiners past max_num_seqs).
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] events stream, KEYS[4] the worker's levels hash,
-- KEYS[5] the worker's last count-out token.
-- ARGV[1] worker, ARGV[2] requests that left, ARGV[3] events maxlen, ARGV[4] this count-out's token,
-- ARGV[5] the token's ttl (s), then the ids of those that ran in the set.
-- Returns 1 when counted (or already counted), 0 when the worker has no registered set.
local step_sets, step_rows, wake_ups, levels, last_token = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, left, events_maxlen, token, token_ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local FIXED_ARGS = 5

if redis.call('GET', last_token) == token then return 1 end
if #ARGV > FIXED_ARGS then redis.call('HDEL', levels, unpack(ARGV, FIXED_ARGS + 1)) end
if redis.call('HEXISTS', step_sets, worker) == 0 then return 0 end
redis.call('HINCRBY', step_rows, worker, -left)
redis.call('SET', last_token, token, 'EX', token_ttl)
redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'room_free', 'worker', worker)
return 1
