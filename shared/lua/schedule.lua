-- Move queued requests into one batch (the only way into a batch), fenced by the scheduler lease.
-- The batch enters the in-flight set in the same step: from here until every request of it is terminal, the
-- reaper (reap.lua) watches it. Each request that joined gets a ``scheduled`` event.
-- KEYS[1] lease, KEYS[2] batch hash, KEYS[3] inflight zset, KEYS[4] metrics hash, then one stride per request
-- (``request_keys``).
-- ARGV[1] lease token, ARGV[2] batch id, ARGV[3] now (s), then the request ids (KEYS order), then optionally
-- their deadlines (s, '' = none; KEYS order): recorded as field ``deadline`` for scheduler/deadlines.py.
-- Returns the ids that joined (queued and not aborted), or -1 when the lease is not ours.
local lease, batch, inflight, metrics = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FIXED = 4
local token, batch_id, now = ARGV[1], ARGV[2], ARGV[3]
local n = request_count(FIXED)
local function request_id(j) return ARGV[3 + j] end
local function deadline(j) return ARGV[3 + n + j] end

if redis.call('GET', lease) ~= token then return -1 end
local joined, joined_requests, deadlines, entries = {}, {}, {}, {}
for j = 1, n do
  local request = request_at(FIXED, j)
  local st = redis.call('HMGET', request.hash, 'status', 'abort', 'entry')
  if st[1] == STATUS.queued and not st[2] then
    table.insert(joined, request_id(j))
    table.insert(joined_requests, request)
    deadlines[#joined_requests] = deadline(j)
    entries[#joined_requests] = st[3]
  end
end
if #joined == 0 then return joined end
local published_ms  -- the Redis time: the first scheduled event's (lib_time.lua entry_ms), no TIME call
for r, request in ipairs(joined_requests) do
  local fields = {'status', STATUS.scheduled, 'batch_id', batch_id, 'batch_size', #joined, 'scheduled_at', now}
  if deadlines[r] and deadlines[r] ~= '' then
    table.insert(fields, 'deadline')
    table.insert(fields, deadlines[r])
  end
  redis.call('HSET', request.hash, unpack(fields))
  local event = redis.call('XADD', request.events, '*', 'event', STATUS.scheduled, 'batch_id', batch_id,
                           'batch_size', #joined)
  published_ms = published_ms or entry_ms(event)
end
redis.call('HSET', batch, 'ids', table.concat(joined, ' '), 'created_at', now, 'attempts', 0,
           'published_ms', published_ms, 'seq', 1, 'published_seq', 1)
redis.call('ZADD', inflight, published_ms, batch_id)
-- metrics (shared/metrics.py): the batch's size, and each request's admission wait (its stream entry id, Redis ms,
-- to now) in the power-of-two ms buckets of shared.metrics.pow2_ms_bucket; one increment per bucket the batch
-- touches and one of the sum, not one per request
redis.call('HINCRBY', metrics, 'batch_size:' .. #joined, 1)
local buckets, bucket_order, waited, any_wait = {}, {}, 0, false
for r = 1, #joined_requests do
  local entry = entries[r]
  if entry then
    local wait, bucket = math.max(0, published_ms - tonumber(string.match(entry, '^%d+'))), 1
    while bucket < wait do bucket = bucket * 2 end
    if not buckets[bucket] then
      buckets[bucket] = 0
      table.insert(bucket_order, bucket)
    end
    buckets[bucket] = buckets[bucket] + 1
    waited, any_wait = waited + wait, true
  end
end
for _, bucket in ipairs(bucket_order) do
  redis.call('HINCRBY', metrics, 'admission_wait_ms:' .. bucket, buckets[bucket])
end
if any_wait then redis.call('HINCRBYFLOAT', metrics, 'admission_wait:sum', waited / 1000) end
return joined
