-- Step mode (docs/step_mode.md): send a scheduled batch to a worker's running set of the same step key, when the
-- worker is alive, its set is open on that key and has room for the batch's requests. The set's request count
-- grows by the batch's, the batch message goes to the worker's inbox (read at its next step boundary), and the batch
-- occupies no worker slot of its own (the set holds its worker's): it joins the storing zset (free_slots.lua).
-- A batch sent to a worker that dies before claiming it is never claimed: the reaper publishes it again after the
-- claim timeout, as a lost message.
-- KEYS[1] step sets hash (worker -> step key digest), KEYS[2] step rows hash (worker -> requests in its set),
-- KEYS[3] the worker's inbox list, KEYS[4] workers zset, KEYS[5] storing zset.
-- ARGV[1] worker, ARGV[2] step key digest, ARGV[3] batch message (JSON), ARGV[4] batch id, ARGV[5] requests in the
-- batch, ARGV[6] most requests in a set, ARGV[7] worker ttl (ms), ARGV[8] inbox ttl (ms).
-- Returns 1 when sent, 0 when refused (the caller publishes the batch to the queue instead).
local step_sets, step_rows, inbox, workers, storing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, digest, message, batch_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local requests, most, worker_ttl_ms, inbox_ttl_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]

local now = now_ms()  -- lib_time.lua
local beat = redis.call('ZSCORE', workers, worker)
if not beat or tonumber(beat) < now - worker_ttl_ms then return 0 end
if redis.call('HGET', step_sets, worker) ~= digest then return 0 end
local rows = tonumber(redis.call('HGET', step_rows, worker) or '0')
if rows + requests > most then return 0 end
redis.call('HINCRBY', step_rows, worker, requests)
redis.call('RPUSH', inbox, message)
redis.call('PEXPIRE', inbox, inbox_ttl_ms)
redis.call('ZADD', storing, now, batch_id)
return 1
