-- Step mode (docs/step_mode.md): a worker's running set takes no more joins (it still drains its inbox and rows).
-- Only while the set is registered (a swept or dropped set is not recreated; step_reregister.lua registers a swept one
-- again, sealed when its seal fell due).
-- KEYS[1] step sets hash. ARGV[1] worker, ARGV[2] the sealed value (shared.keys.STEP_SEALED).
-- Returns 1 when sealed, 0 when the worker has no registered set.
local step_sets, worker, sealed = KEYS[1], ARGV[1], ARGV[2]

if redis.call('HEXISTS', step_sets, worker) == 0 then return 0 end
redis.call('HSET', step_sets, worker, sealed)
return 1
