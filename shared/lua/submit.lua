-- Submit requests atomically: state hash + stream entry, refused as a whole when the queue is full.
-- An image-conditioned request's input image and mask are stored in its hash (fields input_image, input_mask), so
-- they live and expire with it; the stream entry carries only the spec, and the hash remembers the entry's id
-- (``entry``) so that aborting a queued request frees its place in the queue at once.
-- Each request's event stream (its hash key .. ':events', see shared/keys.py) gets its ``queued`` event.
-- With an API key (its name ARGV[2]; '' = none) each hash records the name (field ``key``). With a max queued
-- for the key, ARGV[3] names the key's set of unfinished requests (their hash keys, see shared/keys.py): it is
-- pruned of the finished and expired ones, the submission is refused as a whole when the key would then have more
-- than ARGV[4] requests queued, scheduled or running, and the set expires ARGV[5] s after the key's last submission.
-- The input budget: ``P:inputs:bytes`` (named from the request hash keys, as ``:metrics``) is the bytes of input
-- images held by unfinished requests; the submission is refused as a whole when its own would take it past ARGV[6]
-- ('' = counted, no budget), else they are added to it, and each hash records its share (field ``input_bytes``):
-- every script that ends a request takes that off again (lib_drop_inputs.lua).
-- KEYS[1] stream, KEYS[2..] request hashes.  ARGV[1] max queue length, ARGV[2] API key name, ARGV[3] its unfinished
-- set ('' = no max queued), ARGV[4] its max queued, ARGV[5] the set's TTL (s), ARGV[6] the input budget (bytes);
-- then per request: id, spec json, created_at, input image bytes ('' = none), input mask bytes ('' = none); then
-- optionally, per request (KEYS order), its webhook URL ('' = none) and the stream events it subscribes to (field
-- webhook_on, shared/webhooks.py).
-- Returns 1 when accepted, 0 when the queue is full, -1 when the key's max queued is reached, -2 when the input
-- budget is.
if redis.call('XLEN', KEYS[1]) + #KEYS - 1 > tonumber(ARGV[1]) then return 0 end
if ARGV[3] ~= '' then
  local unfinished = 0
  for _, hash in ipairs(redis.call('SMEMBERS', ARGV[3])) do
    local status = redis.call('HGET', hash, 'status')
    if status == 'queued' or status == 'scheduled' or status == 'running' then
      unfinished = unfinished + 1
    else
      redis.call('SREM', ARGV[3], hash)
    end
  end
  if unfinished + #KEYS - 1 > tonumber(ARGV[4]) then return -1 end
end
local inputs = 0
for i = 2, #KEYS do
  local a = 7 + (i - 2) * 5
  inputs = inputs + #ARGV[a + 3] + #ARGV[a + 4]
end
local held_key = inputs > 0 and string.match(KEYS[2], '^(.*):req:') .. ':inputs:bytes'
if held_key and ARGV[6] ~= '' and tonumber(redis.call('GET', held_key) or '0') + inputs > tonumber(ARGV[6]) then
  return -2
end
for i = 2, #KEYS do
  local a = 7 + (i - 2) * 5
  redis.call('HSET', KEYS[i], 'spec', ARGV[a + 1], 'status', 'queued', 'created_at', ARGV[a + 2])
  if ARGV[2] ~= '' then redis.call('HSET', KEYS[i], 'key', ARGV[2]) end
  if ARGV[3] ~= '' then redis.call('SADD', ARGV[3], KEYS[i]) end
  if ARGV[a + 3] ~= '' then redis.call('HSET', KEYS[i], 'input_image', ARGV[a + 3]) end
  if ARGV[a + 4] ~= '' then redis.call('HSET', KEYS[i], 'input_mask', ARGV[a + 4]) end
  local counted = #ARGV[a + 3] + #ARGV[a + 4]  -- what it adds to the budget: lib_drop_inputs.lua takes it off
  if counted > 0 then redis.call('HSET', KEYS[i], 'input_bytes', counted) end
  local entry = redis.call('XADD', KEYS[1], '*', 'id', ARGV[a], 'spec', ARGV[a + 1])
  redis.call('HSET', KEYS[i], 'entry', entry)
  redis.call('XADD', KEYS[i] .. ':events', '*', 'event', 'queued')
  local hook = 6 + (#KEYS - 1) * 5 + (i - 2) * 2  -- webhook (shared/webhooks.py)
  if ARGV[hook + 1] and ARGV[hook + 1] ~= '' then
    redis.call('HSET', KEYS[i], 'webhook', ARGV[hook + 1], 'webhook_on', ARGV[hook + 2])
  end
end
if ARGV[3] ~= '' then redis.call('EXPIRE', ARGV[3], ARGV[5]) end
if held_key then redis.call('INCRBY', held_key, inputs) end
-- metrics (shared/metrics.py): the hash is named from a request hash key, P:req:{id} -> P:metrics
if KEYS[2] then redis.call('HINCRBY', string.match(KEYS[2], '^(.*):req:') .. ':metrics', 'accepted', #KEYS - 1) end
return 1
