-- A worker that cannot finish what it holds through no fault of its requests (its result store hangs) gives a batch
-- back to the reaper, uncounted: with its claim token, the requests it runs under that claim lose the token (they
-- stay running with no claim, as split_plan's put-aside rows do: the run can finish none of them, and the next
-- claim, seeing no claim on them, counts no lost run, splits nothing and runs them as they were), and its lock goes,
-- so the reaper publishes the batch again at its next pass (it was claimed since it was last published). Without a
-- token (a message taken but not claimed: a quarantined worker) the batch is only made due: its publication time
-- goes to 0, so the reaper publishes it again at its next pass unless a copy waits in the broker queue or a run
-- holds it.
-- The caller passes the requests of the batch (its ``ids``, as reap.lua reads them); only those are handed back.
-- KEYS[1] batch lock, KEYS[2] batch hash, then one stride per request of the batch (``request_keys``).
-- ARGV[1] claim token ('' = none), ARGV[2..] the request ids (KEYS order).
-- Returns the number of requests handed back, or -1 when the token no longer holds the lock (nothing changed).
local lock, batch = KEYS[1], KEYS[2]
local FIXED = 2
local token = ARGV[1]
local given = {}
for j = 1, request_count(FIXED) do given[ARGV[1 + j]] = request_at(FIXED, j) end

local handed = 0
if token ~= '' then
  if redis.call('GET', lock) ~= token then return -1 end
  for id in string.gmatch(redis.call('HGET', batch, 'ids') or '', '%S+') do
    local request = given[id]
    if request then
      local st = redis.call('HMGET', request.hash, 'status', 'claim')
      if st[1] == STATUS.running and st[2] == token then
        redis.call('HDEL', request.hash, 'claim')
        handed = handed + 1
      end
    end
  end
  redis.call('DEL', lock)
elseif redis.call('EXISTS', batch) == 1 then
  redis.call('HSET', batch, 'published_ms', 0)
end
return handed
