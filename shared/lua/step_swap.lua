-- Step mode (docs/step_mode.md, "Fair sharing within a level"): in one step, ask a worker's full running set to
-- evict one of its requests at its next step boundary AND send it the scheduled batch that takes that request's
-- room, so that both happen at that one boundary (the eviction first: the inbox is read in order). Used by the
-- fair order, whose flows of one level may take a row from a flow running at least two more (scheduler.policy.swap).
-- Sent only when the worker is alive, its set is open on the given step key (not sealed, not closed) and the set
-- would hold at most one request past ``most`` until the eviction is done. When the request to evict still runs
-- there (its field in the set's levels hash), the eviction message (naming the batch, so that the worker honours it
-- even once sealed, and holds the batch back a boundary when the request is in its last step) goes to the inbox
-- before the batch; when it left meanwhile, or the set has room for the batch already, the batch is sent as a plain
-- join (step_join.lua) if its room is there.
-- The set's request count grows by the batch's (requeue.lua lowers it when the eviction is done).
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] the worker's inbox list, KEYS[4] workers zset,
-- KEYS[5] storing zset, KEYS[6] the worker's step levels hash.
-- ARGV[1] worker, ARGV[2] step key digest, ARGV[3] batch message (JSON), ARGV[4] batch id, ARGV[5] requests in the
-- batch, ARGV[6] most requests in a set, ARGV[7] worker ttl (ms), ARGV[8] inbox ttl (ms), ARGV[9] the request to
-- evict, ARGV[10] the eviction message (JSON).
-- Returns 2 when the eviction and the batch were sent, 1 when only the batch (a plain join: the request had left,
-- or the set had room already), 0 when refused (the caller publishes the batch to the queue instead).
local step_sets, step_rows, inbox, workers, storing, levels = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local worker, digest, message, batch_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local requests, most, worker_ttl_ms, inbox_ttl_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local victim, eviction = ARGV[9], ARGV[10]

local now = now_ms()  -- lib_time.lua
local beat = redis.call('ZSCORE', workers, worker)
if not beat or tonumber(beat) < now - worker_ttl_ms then return 0 end
if redis.call('HGET', step_sets, worker) ~= digest then return 0 end
local rows = tonumber(redis.call('HGET', step_rows, worker) or '0')
-- no one is evicted when the room is there already (a row was counted out since the scheduler looked)
local evicts = rows + requests > most and redis.call('HEXISTS', levels, victim) == 1
local room = most
if evicts then room = most + 1 end
if rows + requests > room then return 0 end
if evicts then redis.call('RPUSH', inbox, eviction) end
redis.call('HINCRBY', step_rows, worker, requests)
redis.call('RPUSH', inbox, message)
redis.call('PEXPIRE', inbox, inbox_ttl_ms)
redis.call('ZADD', storing, now, batch_id)
if evicts then return 2 end
return 1
