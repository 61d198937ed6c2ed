-- A run's forward is over and its outputs are being stored (behind the worker's next forward): while the run still
-- holds the batch, mark the batch as storing, which frees its worker's slot for the next batch (free_slots.lua),
-- and wake the scheduler. The batch stays in flight, locked, until batch_done.lua (or the reaper) ends it.
-- KEYS[1] batch lock, KEYS[2] storing zset, KEYS[3] events stream.
-- ARGV[1] claim token, ARGV[2] batch id, ARGV[3] events maxlen.
-- Returns 1 when marked, 0 when the run no longer holds the batch.
local lock, storing, wake_ups = KEYS[1], KEYS[2], KEYS[3]
local token, batch_id, events_maxlen = ARGV[1], ARGV[2], ARGV[3]

if redis.call('GET', lock) ~= token then return 0 end
local wake_up = redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'slot_free', 'batch_id',
                          batch_id)
redis.call('ZADD', storing, entry_ms(wake_up), batch_id)  -- the Redis time, from the wake-up's id (lib_time.lua)
return 1
