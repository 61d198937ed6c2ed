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
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local beat = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not beat or tonumber(beat) < now - tonumber(ARGV[7]) then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local rows = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if rows + tonumber(ARGV[5]) > tonumber(ARGV[6]) then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[5])
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[8])
redis.call('ZADD', KEYS[5], now, ARGV[4])
return 1
