-- Step mode (docs/step_mode.md): a worker's running set is empty; close it unless batches wait in its inbox (then
-- the worker claims them and goes on). A closed set frees the worker's slot: wake the scheduler.
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] the worker's inbox list, KEYS[4] events stream,
-- KEYS[5] the worker's open set id (deleted with the set: a late step_reregister.lua finds it gone).
-- ARGV[1] worker, ARGV[2] events maxlen.
-- Returns 1 when closed, 0 when the inbox holds batches.
local step_sets, step_rows, inbox, wake_ups, open = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, events_maxlen = ARGV[1], ARGV[2]

if redis.call('LLEN', inbox) > 0 then return 0 end
redis.call('HDEL', step_sets, worker)
redis.call('HDEL', step_rows, worker)
redis.call('DEL', open)
redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'slot_free', 'worker', worker)
return 1
