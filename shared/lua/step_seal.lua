-- Step mode (docs/step_mode.md): a worker's running set takes no more joins (it still drains its inbox and rows).
-- Only while the set is registered (a swept or dropped set is not recreated).
-- KEYS[1] step sets hash. ARGV[1] worker, ARGV[2] the sealed value (shared.keys.STEP_SEALED).
-- Returns 1 when sealed, 0 when the worker has no registered set.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
