-- Move queued requests into one batch (the only way into a batch), fenced by the scheduler lease.
-- The batch enters the in-flight set in the same step: from here until every request of it is terminal, the
-- reaper (reap.lua) watches it. Each request that joined gets a ``scheduled`` event (its hash key .. ':events').
-- KEYS[1] lease, KEYS[2] batch hash, KEYS[3] inflight zset, KEYS[4..] request hashes.
-- ARGV[1] lease token, ARGV[2] batch id, ARGV[3] now (s), then the request ids (KEYS order), then optionally
-- their deadlines (s, '' = none; KEYS order): recorded as field ``deadline`` for scheduler/deadlines.py.
-- Returns the ids that joined (queued and not aborted), or -1 when the lease is not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local joined = {}
local joined_keys = {}
local deadlines = {}
for i = 4, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort')
  if st[1] == 'queued' and not st[2] then
    table.insert(joined, ARGV[i])
    table.insert(joined_keys, KEYS[i])
    deadlines[KEYS[i]] = ARGV[#KEYS + i - 3]
  end
end
if #joined == 0 then return joined end
for _, k in ipairs(joined_keys) do
  redis.call('HSET', k, 'status', 'scheduled', 'batch_id', ARGV[2], 'batch_size', #joined, 'scheduled_at', ARGV[3])
  redis.call('XADD', k .. ':events', '*', 'event', 'scheduled', 'batch_id', ARGV[2], 'batch_size', #joined)
  if deadlines[k] and deadlines[k] ~= '' then redis.call('HSET', k, 'deadline', deadlines[k]) end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], 'ids', table.concat(joined, ' '), 'created_at', ARGV[3], 'attempts', 0,
           'published_ms', now_ms, 'seq', 1, 'published_seq', 1)
redis.call('ZADD', KEYS[3], now_ms, ARGV[2])
-- metrics (shared/metrics.py): the batch's size, and each request's admission wait (its stream entry id, Redis ms,
-- to now) in the power-of-two ms buckets of shared.metrics.pow2_ms_bucket
local metrics = string.match(KEYS[4], '^(.*):req:') .. ':metrics'
redis.call('HINCRBY', metrics, 'batch_size:' .. #joined, 1)
for _, k in ipairs(joined_keys) do
  local entry = redis.call('HGET', k, 'entry')
  if entry then
    local wait, bucket = math.max(0, now_ms - tonumber(string.match(entry, '^%d+'))), 1
    while bucket < wait do bucket = bucket * 2 end
    redis.call('HINCRBY', metrics, 'admission_wait_ms:' .. bucket, 1)
    redis.call('HINCRBYFLOAT', metrics, 'admission_wait:sum', wait / 1000)
  end
end
return joined
