-- The reaper: look at every batch in flight that no run holds (no lock) and decide, atomically:
--   * none of its requests is unfinished -> take it out of flight (its hash expires);
--   * it was claimed since it was last published (claims and publications are numbered by the batch's ``seq``)
--     -> its run ended without finishing it (worker died, lost Redis, or hit an error it could not report):
--     publish it again now;
--   * it was published and not claimed since, for longer than the claim timeout, and no copy of its message
--     waits in any broker queue it may wait in -> the message was lost: publish it again.
-- Each decision to publish stamps published_seq and published_ms, so a batch is republished once per claim or
-- per timeout. Times are Redis server time (ms), so the clocks of scheduler and worker hosts do not matter.
-- A batch no run holds stores behind no forward: it leaves the storing zset (its worker died while storing), but for
-- one never claimed (sent to a step-mode set by step_join.lua, waiting in its inbox: the set holds the slot), which
-- leaves it only when it is taken out of flight or published again.
-- The caller names the batches (those it read in flight, in score order) and their requests (each batch's ``ids``,
-- written once by schedule.lua); a batch no longer in flight is passed over, a request of a batch it did not name
-- counts as unfinished.
-- KEYS[1] inflight zset, KEYS[2] storing zset, then the broker queues a batch may wait in (lists of Celery messages:
-- every model's queue and each live worker's own, ``queues_in_fleet_redis``; none when the broker is not this Redis:
-- nothing here to read, so a batch unclaimed past the claim timeout is published again, and a copy still waiting in
-- that broker finds it claimed or done); then per batch: its hash, its lock, and one stride per request of it
-- (``request_keys``).
-- ARGV[1] claim timeout (ms), ARGV[2] ttl of a finished batch hash (s), ARGV[3] number of broker queues; then per
-- batch: its id, its number of requests, their ids (KEYS order).
-- Returns {{batch id, its request ids (space separated), ...} to publish again, number taken out of flight}.
local inflight, storing = KEYS[1], KEYS[2]
local claim_timeout_ms, ttl, queue_count = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local batches = {}  -- {id, hash, lock, requests = {request id -> its keys}}, in the caller's order
local key_at, arg_at = 3 + queue_count, 4
while arg_at <= #ARGV do
  local b = {id = ARGV[arg_at], hash = KEYS[key_at], lock = KEYS[key_at + 1], requests = {}}
  local count = tonumber(ARGV[arg_at + 1])
  for j = 1, count do b.requests[ARGV[arg_at + 1 + j]] = request_at(key_at + 1, j) end
  table.insert(batches, b)
  key_at, arg_at = key_at + 2 + count * REQUEST_STRIDE, arg_at + 2 + count
end

local now = now_ms()  -- lib_time.lua
local republish, overdue, members = {}, {}, {}
local removed = 0
for _, b in ipairs(batches) do
  local batch_id = b.id
  if redis.call('ZSCORE', inflight, batch_id) and redis.call('EXISTS', b.lock) == 0 then
    local st = redis.call('HMGET', b.hash, 'ids', 'claimed_seq', 'published_seq', 'published_ms')
    if st[2] then redis.call('ZREM', storing, batch_id) end
    members[batch_id] = st[1] or ''
    local live = false
    for id in string.gmatch(st[1] or '', '%S+') do
      local request = b.requests[id]
      if not request then live = true break end
      local req = redis.call('HMGET', request.hash, 'status', 'batch_id')
      if (req[1] == STATUS.scheduled or req[1] == STATUS.running) and req[2] == batch_id then live = true break end
    end
    if not live then
      redis.call('ZREM', inflight, batch_id)
      redis.call('ZREM', storing, batch_id)
      redis.call('EXPIRE', b.hash, ttl)
      removed = removed + 1
    else
      if tonumber(st[2] or '0') > tonumber(st[3] or '0') then
        table.insert(republish, b)
      elseif now - tonumber(st[4] or '0') > claim_timeout_ms then
        table.insert(overdue, b)
      end
    end
  end
end
if #overdue > 0 then
  local queued = {}
  for q = 3, 2 + queue_count do
    for _, message in ipairs(redis.call('LRANGE', KEYS[q], 0, -1)) do table.insert(queued, message) end
  end
  for _, b in ipairs(overdue) do
    local waiting = false
    for _, message in ipairs(queued) do
      if string.find(message, b.id, 1, true) then waiting = true break end
    end
    if not waiting then table.insert(republish, b) end
  end
end
local out = {}
for _, b in ipairs(republish) do
  redis.call('HSET', b.hash, 'published_ms', now, 'published_seq', redis.call('HINCRBY', b.hash, 'seq', 1))
  redis.call('ZREM', storing, b.id)
  table.insert(out, b.id)
  table.insert(out, members[b.id])
end
return {out, removed}
