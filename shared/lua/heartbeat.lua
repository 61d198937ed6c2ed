-- A worker announces its slot, scored by Redis server time (so host clocks do not matter to liveness), and what
-- its model can do; unless the worker is quarantined (its result store hung under it, gpu_worker.app's retire):
-- then it counts as no slot until the quarantine key expires.
-- KEYS[1] workers zset, KEYS[2] events stream, KEYS[3] capabilities hash, KEYS[4] the worker's quarantine key.
-- ARGV[1] worker name, ARGV[2] 1 = also wake the scheduler (the first beat), ARGV[3] events maxlen,
-- ARGV[4] capabilities JSON.
-- Returns 1 when announced, 2 when announced anew (the worker was not among the live ones: its first beat, or one
-- after a late beat had it swept, free_slots.lua, or after it left), 0 when quarantined (nothing written).
local workers, wake_ups, capabilities, quarantine = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, first, events_maxlen, announced = ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4]

if redis.call('EXISTS', quarantine) == 1 then return 0 end
local added = redis.call('ZADD', workers, now_ms(), worker)  -- lib_time.lua
redis.call('HSET', capabilities, worker, announced)
if first then
  redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'worker_up', 'worker', worker)
end
return 1 + added
