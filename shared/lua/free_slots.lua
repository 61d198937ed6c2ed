-- Free worker slots: live workers (a heartbeat within the ttl, by Redis server time; stale ones are swept, with
-- their capabilities and step-mode sets) minus what occupies a worker: every batch in flight but those in the
-- storing zset (their forward is over while their outputs are stored, forward_done.lua; or they run in a step-mode
-- set, step_join.lua), plus every open step-mode set (it holds its worker's slot while rows join and leave).
-- KEYS[1] workers zset, KEYS[2] inflight zset, KEYS[3] capabilities hash, KEYS[4] storing zset,
-- KEYS[5] step sets hash, KEYS[6] step rows hash.
-- ARGV[1] worker ttl (ms).
-- Returns {free slots (negative when more is busy than live), live workers that announced what they serve (the
-- capabilities left after the sweep; heartbeat.lua writes a worker's with its beat)}: one snapshot of both, so the
-- scheduler's prefetch bound (scheduler/capacity.py prefetch_room) needs no read of its own.
local workers, inflight, capabilities, storing, step_sets, step_rows = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local worker_ttl_ms = tonumber(ARGV[1])

local cutoff = now_ms() - worker_ttl_ms  -- lib_time.lua
local live = redis.call('ZCARD', workers)
local stale = redis.call('ZRANGEBYSCORE', workers, '-inf', cutoff)
live = live - #stale  -- what the sweep below leaves
if #stale > 0 then
  redis.call('HDEL', capabilities, unpack(stale))
  redis.call('HDEL', step_sets, unpack(stale))
  redis.call('HDEL', step_rows, unpack(stale))
  redis.call('ZREMRANGEBYSCORE', workers, '-inf', cutoff)
end
local busy = redis.call('ZCARD', inflight) - redis.call('ZINTERCARD', 2, inflight, storing)
  + redis.call('HLEN', step_sets)
return {live - busy, math.min(live, redis.call('HLEN', capabilities))}
