-- Submit requests atomically: state hash + stream entry, refused as a whole when the queue is full.
-- An image-conditioned request's input image and mask are stored in its hash (fields input_image, input_mask), so
-- they live and expire with it; the stream entry carries only the spec, and the hash remembers the entry's id
-- (``entry``) so that aborting a queued request frees its place in the queue at once. Each request's event stream
-- gets its ``queued`` event.
-- With an API key (its name ARGV[2]; '' = none) each hash and stream entry records the name (field ``key``), and
-- with a share other than 1 (ARGV[7], '' = 1: its weight in the fair order, scheduler/queue.py) the share too
-- (field ``share``; requeue.lua copies both into the new entry). With a max queued for
-- the key (ARGV[3] = '1'), the key's set of unfinished requests (their hash keys) is pruned of the finished and
-- expired ones, the submission is refused as a whole when the key would then have more than ARGV[4] requests
-- queued, scheduled or running, and the set expires ARGV[5] s after the key's last submission.
-- The input budget: the input bytes counter is the bytes of input images held by unfinished requests; the
-- submission is refused as a whole when its own would take it past ARGV[6] ('' = counted, no budget), else they
-- are added to it, and each hash records its share (field ``input_bytes``): every script that ends a request takes
-- that off again (lib_drop_inputs.lua).
-- The fleet's accepted count is this stream's entries added (XINFO STREAM), less requeue.lua's: no counter here
-- (shared/fleet_state.py accepted_count).
-- KEYS[1] request stream, KEYS[2] input bytes counter, KEYS[3] the API key's unfinished set (touched only with
-- ARGV[3] = '1'), then one stride per request (``request_keys``: hash, events, packed).
-- ARGV[1] max queue length, ARGV[2] API key name, ARGV[3] '1' = the key has a max queued, ARGV[4] its max queued,
-- ARGV[5] the set's TTL (s), ARGV[6] the input budget (bytes), ARGV[7] the key's share; then per request: id, spec
-- json, created_at, input image bytes ('' = none), input mask bytes ('' = none); then optionally, per request (KEYS
-- order), its webhook URL ('' = none) and the stream events it subscribes to (field webhook_on, shared/webhooks.py).
-- Returns 1 when accepted, 0 when the queue is full, -1 when the key's max queued is reached, -2 when the input
-- budget is.
-- The set holds hash keys: the one place a script reads key names from data (the key's own requests, to count).
local stream, inputs_key, unfinished_set = KEYS[1], KEYS[2], KEYS[3]
local FIXED = 3
local FIXED_ARGS = 7
local max_len, key_name, has_max_queued, max_queued = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local set_ttl, budget, share = ARGV[5], ARGV[6], ARGV[7]
local n = request_count(FIXED)
local function request_args(j) return FIXED_ARGS + 1 + (j - 1) * 5 end  -- id, spec, created_at, image, mask
local function hook_args(j) return FIXED_ARGS + n * 5 + (j - 1) * 2 end  -- url, events (webhook_on)

if redis.call('XLEN', stream) + n > tonumber(max_len) then return 0 end
if has_max_queued then
  local count = 0
  for _, hash in ipairs(redis.call('SMEMBERS', unfinished_set)) do
    local status = redis.call('HGET', hash, 'status')
    if status and not TERMINAL[status] then
      count = count + 1
    else
      redis.call('SREM', unfinished_set, hash)
    end
  end
  if count + n > tonumber(max_queued) then return -1 end
end
local inputs = 0
for j = 1, n do
  local a = request_args(j)
  inputs = inputs + #ARGV[a + 3] + #ARGV[a + 4]
end
if inputs > 0 and budget ~= '' and tonumber(redis.call('GET', inputs_key) or '0') + inputs > tonumber(budget) then
  return -2
end
local owner = {}  -- every entry's and hash's owner fields: the key's name and share (the fair order's flow, weight)
if key_name ~= '' then
  owner = {'key', key_name}
  if share ~= '' then table.insert(owner, 'share'); table.insert(owner, share) end
end
for j = 1, n do
  local request, a = request_at(FIXED, j), request_args(j)
  local hash = request.hash
  local entry = redis.call('XADD', stream, '*', 'id', ARGV[a], 'spec', ARGV[a + 1], unpack(owner))
  local fields = {'spec', ARGV[a + 1], 'status', STATUS.queued, 'created_at', ARGV[a + 2], 'entry', entry}
  local function field(name, value)
    table.insert(fields, name)
    table.insert(fields, value)
  end
  for i = 1, #owner, 2 do field(owner[i], owner[i + 1]) end
  if has_max_queued then redis.call('SADD', unfinished_set, hash) end
  if ARGV[a + 3] ~= '' then field('input_image', ARGV[a + 3]) end
  if ARGV[a + 4] ~= '' then field('input_mask', ARGV[a + 4]) end
  local counted = #ARGV[a + 3] + #ARGV[a + 4]  -- what it adds to the budget: lib_drop_inputs.lua takes it off
  if counted > 0 then field('input_bytes', counted) end
  local hook = hook_args(j)  -- webhook (shared/webhooks.py)
  if ARGV[hook + 1] and ARGV[hook + 1] ~= '' then
    field('webhook', ARGV[hook + 1])
    field('webhook_on', ARGV[hook + 2])
  end
  redis.call('HSET', hash, unpack(fields))  -- one write of everything it records
  redis.call('XADD', request.events, '*', 'event', STATUS.queued)
end
if has_max_queued then redis.call('EXPIRE', unfinished_set, set_ttl) end
if inputs > 0 then redis.call('INCRBY', inputs_key, inputs) end
return 1
