-- A worker announces its slot, scored by Redis server time (so host clocks do not matter to liveness), and what
-- its model can do; unless the worker is quarantined (its result store hung under it, gpu_worker.app's retire):
-- then it counts as no slot until the quarantine key expires.
-- KEYS[1] workers zset, KEYS[2] events stream, KEYS[3] capabilities hash, KEYS[4] the worker's quarantine key.
-- ARGV[1] worker name, ARGV[2] 1 = also wake the scheduler (the first beat), ARGV[3] events maxlen,
-- ARGV[4] capabilities JSON.
-- Returns 1 when announced, 0 when quarantined (nothing written).
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
if ARGV[2] == '1' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'type', 'worker_up', 'worker', ARGV[1])
end
return 1
