-- A worker that cannot finish what it holds through no fault of its requests (its result store hangs) gives a batch
-- back to the reaper, uncounted: with its claim token, the requests it runs under that claim lose the token (they
-- stay running with no claim, as split_plan's put-aside rows do: the run can finish none of them, and the next
-- claim, seeing no claim on them, counts no lost run, splits nothing and runs them as they were), and its lock goes,
-- so the reaper publishes the batch again at its next pass (it was claimed since it was last published). Without a
-- token (a message taken but not claimed: a quarantined worker) the batch is only made due: its publication time
-- goes to 0, so the reaper publishes it again at its next pass unless a copy waits in the broker queue or a run
-- holds it.
-- KEYS[1] batch lock, KEYS[2] batch hash (its ``ids`` name the requests, as reap.lua reads them).
-- ARGV[1] claim token ('' = none), ARGV[2] key prefix.
-- Returns the number of requests handed back, or -1 when the token no longer holds the lock (nothing changed).
local given = 0
if ARGV[1] ~= '' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
  for id in string.gmatch(redis.call('HGET', KEYS[2], 'ids') or '', '%S+') do
    local key = ARGV[2] .. ':req:' .. id
    local st = redis.call('HMGET', key, 'status', 'claim')
    if st[1] == 'running' and st[2] == ARGV[1] then
      redis.call('HDEL', key, 'claim')
      given = given + 1
    end
  end
  redis.call('DEL', KEYS[1])
elseif redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'published_ms', 0)
end
return given
