-- Step mode (docs/step_mode.md, "Priorities and preemption"): ask a worker's running set to evict one of its
-- requests at its next step boundary, so that a waiting request of a higher level takes its room. Sent only while
-- the set is open on the given step key (not sealed, not closed) and still runs the request (its field in the set's
-- levels hash, written by the worker when it joins and removed when it leaves): the message goes to the worker's
-- inbox, which the set drains before it may close (step_close.lua), so it is read by the very set it was meant for.
-- The worker requeues the request (requeue.lua) or, when it ended meanwhile, ignores the message.
-- KEYS[1] step sets hash, KEYS[2] the worker's step levels hash, KEYS[3] the worker's inbox list.
-- ARGV[1] worker, ARGV[2] step key digest, ARGV[3] request id, ARGV[4] eviction message (JSON), ARGV[5] inbox ttl (ms).
-- Returns 1 when sent, 0 when refused.
local step_sets, levels, inbox = KEYS[1], KEYS[2], KEYS[3]
local worker, digest, request_id, message, inbox_ttl_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call('HGET', step_sets, worker) ~= digest then return 0 end
if redis.call('HEXISTS', levels, request_id) == 0 then return 0 end
redis.call('RPUSH', inbox, message)
redis.call('PEXPIRE', inbox, inbox_ttl_ms)
return 1
