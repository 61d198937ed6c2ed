-- Step mode (docs/step_mode.md): a worker's running set is empty; close it unless batches wait in its inbox (then
-- the worker claims them and goes on). A closed set frees the worker's slot: wake the scheduler.
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] the worker's inbox list, KEYS[4] events stream.
-- ARGV[1] worker, ARGV[2] events maxlen.
-- Returns 1 when closed, 0 when the inbox holds batches.
if redis.call('LLEN', KEYS[3]) > 0 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'type', 'slot_free', 'worker', ARGV[1])
return 1
