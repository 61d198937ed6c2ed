-- A run of a batch is over: drop its lock (if still ours) and, once no request of the batch is left unfinished
-- and no other run holds it, take the batch out of flight (its hash then expires) and wake the scheduler.
-- A batch with unfinished requests stays in flight: the reaper publishes it again.
-- The scheduler is woken (``batch_done`` on the events stream) only when the batch held a worker's slot until now:
-- one in the storing zset held none (its slot was freed, and announced, by forward_done.lua), so its leaving
-- flight changes no free-slot count (free_slots.lua) nor any model's busy count, and wakes nobody.
-- Unless another run holds the batch, it no longer stores behind a forward (forward_done.lua): it leaves the storing
-- zset, whether this run's lock was still there or had lapsed (a run that lost its lock must not leave a member that
-- frees a slot for no run), but for a batch published again since its last claim (it may wait in a step-mode set's
-- inbox, step_join.lua: there it is the set that holds the slot), which leaves it once taken out of flight.
-- The caller passes the requests of the batch (its ``ids``, written once by schedule.lua); one of them it did not
-- pass counts as unfinished (the batch stays in flight for the reaper).
-- KEYS[1] batch lock, KEYS[2] inflight zset, KEYS[3] events stream, KEYS[4] batch hash, KEYS[5] storing zset, then
-- one stride per request of the batch (``request_keys``).
-- ARGV[1] claim token, ARGV[2] batch id, ARGV[3] events maxlen, ARGV[4] ttl (s), ARGV[5..4 + n] the request ids (KEYS
-- order), then those of them the caller saw terminal (a claim's or finish's reply): a terminal status never changes,
-- so their hashes are not read.
-- Returns 1 when the batch left flight, 0 when it stays.
local lock, inflight, wake_ups, batch, storing = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local FIXED = 5
local token, batch_id, events_maxlen, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local given, ended, n = {}, {}, request_count(FIXED)
for j = 1, n do given[ARGV[4 + j]] = request_at(FIXED, j) end
for i = 5 + n, #ARGV do ended[ARGV[i]] = true end

local holder = redis.call('GET', lock)
if holder == token then
  redis.call('DEL', lock)
elseif holder then
  return 0  -- another run holds it
end
local st = redis.call('HMGET', batch, 'ids', 'claimed_seq', 'published_seq')
local unstored = tonumber(st[2] or '0') >= tonumber(st[3] or '0')
local was_storing = unstored and redis.call('ZREM', storing, batch_id) == 1
for id in string.gmatch(st[1] or '', '%S+') do
  local request = given[id]
  if not request then return 0 end
  if not ended[id] then
    local req = redis.call('HMGET', request.hash, 'status', 'batch_id')
    if (req[1] == STATUS.scheduled or req[1] == STATUS.running) and req[2] == batch_id then return 0 end
  end
end
redis.call('ZREM', inflight, batch_id)
if not unstored then was_storing = redis.call('ZREM', storing, batch_id) == 1 end
redis.call('EXPIRE', batch, ttl)
if not was_storing then
  redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'batch_done', 'batch_id', batch_id)
end
return 1
