-- The reaper: look at every batch in flight that no run holds (no lock) and decide, atomically:
--   * none of its requests is unfinished -> take it out of flight (its hash expires);
--   * it was claimed since it was last published (claims and publications are numbered by the batch's ``seq``)
--     -> its run ended without finishing it (worker died, lost Redis, or hit an error it could not report):
--     publish it again now;
--   * it was published and not claimed since, for longer than the claim timeout, and no copy of its message
--     waits in the broker queue -> the message was lost: publish it again.
-- Each decision to publish stamps published_seq and published_ms, so a batch is republished once per claim or
-- per timeout. Times are Redis server time (ms), so the clocks of scheduler and worker hosts do not matter.
-- A batch no run holds stores behind no forward: it leaves the storing zset (its worker died while storing), but for
-- one never claimed (sent to a step-mode set by step_join.lua, waiting in its inbox: the set holds the slot), which
-- leaves it only when it is taken out of flight or published again.
-- KEYS[1] inflight zset, KEYS[2] broker queue (list of Celery messages), KEYS[3] storing zset.
-- ARGV[1] key prefix, ARGV[2] claim timeout (ms), ARGV[3] ttl of a finished batch hash (s).
-- Returns {{batch id, its request ids (space separated), ...} to publish again, number taken out of flight}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local republish, overdue, members = {}, {}, {}
local removed = 0
for _, batch_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local batch = ARGV[1] .. ':batch:' .. batch_id
  if redis.call('EXISTS', batch .. ':lock') == 0 then
    local st = redis.call('HMGET', batch, 'ids', 'claimed_seq', 'published_seq', 'published_ms')
    if st[2] then redis.call('ZREM', KEYS[3], batch_id) end
    members[batch_id] = st[1] or ''
    local live = false
    for id in string.gmatch(st[1] or '', '%S+') do
      local req = redis.call('HMGET', ARGV[1] .. ':req:' .. id, 'status', 'batch_id')
      if (req[1] == 'scheduled' or req[1] == 'running') and req[2] == batch_id then live = true break end
    end
    if not live then
      redis.call('ZREM', KEYS[1], batch_id)
      redis.call('ZREM', KEYS[3], batch_id)
      redis.call('EXPIRE', batch, ARGV[3])
      removed = removed + 1
    else
      if tonumber(st[2] or '0') > tonumber(st[3] or '0') then
        table.insert(republish, batch_id)
      elseif now - tonumber(st[4] or '0') > tonumber(ARGV[2]) then
        table.insert(overdue, batch_id)
      end
    end
  end
end
if #overdue > 0 then
  local queued = redis.call('LRANGE', KEYS[2], 0, -1)
  for _, batch_id in ipairs(overdue) do
    local waiting = false
    for _, message in ipairs(queued) do
      if string.find(message, batch_id, 1, true) then waiting = true break end
    end
    if not waiting then table.insert(republish, batch_id) end
  end
end
local out = {}
for _, batch_id in ipairs(republish) do
  local batch = ARGV[1] .. ':batch:' .. batch_id
  redis.call('HSET', batch, 'published_ms', now, 'published_seq', redis.call('HINCRBY', batch, 'seq', 1))
  redis.call('ZREM', KEYS[3], batch_id)
  table.insert(out, batch_id)
  table.insert(out, members[batch_id])
end
return {out, removed}
