-- A run's forward is over and its outputs are being stored (behind the worker's next forward): while the run still
-- holds the batch, mark the batch as storing, which frees its worker's slot for the next batch (free_slots.lua),
-- and wake the scheduler. The batch stays in flight, locked, until batch_done.lua (or the reaper) ends it.
-- KEYS[1] batch lock, KEYS[2] storing zset, KEYS[3] events.
-- ARGV[1] claim token, ARGV[2] batch id, ARGV[3] events maxlen.
-- Returns 1 when marked, 0 when the run no longer holds the batch.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'slot_free', 'batch_id', ARGV[2])
return 1
