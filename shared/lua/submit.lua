-- Submit groups of requests, each group atomically: state hash + stream entry for every request of a group, or
-- nothing of it when the queue is full, its API key's max queued reached or the input budget spent. Groups are
-- independent submissions (one api process's concurrent ones share the call: api/coalescer.py), taken in order, each
-- accepted or refused on its own: a group sees the queue, the key's count and the budget as the groups before it
-- left them.
-- An image-conditioned request's input image and mask are stored in its hash (fields input_image, input_mask), so
-- they live and expire with it; the stream entry carries only the spec, and the hash remembers the entry's id
-- (``entry``) so that aborting a queued request frees its place in the queue at once. Each request's event stream
-- gets its ``queued`` event.
-- With an API key (a group's key name; '' = none) each hash and stream entry records the name (field ``key``), and
-- with a share other than 1 (its weight in the fair order, scheduler/queue.py; '' = 1) the share too (field
-- ``share``; requeue.lua copies both into the new entry). With a max queued for the key, the key's set of unfinished
-- requests (their hash keys) is pruned of the finished and expired ones, the group is refused when the key would
-- then have more than its max queued requests queued, scheduled or running, and the set expires ARGV[2] s after the
-- key's last submission.
-- The input budget: the input bytes counter is the bytes of input images held by unfinished requests; a group is
-- refused when its own would take it past ARGV[3] ('' = counted, no budget), else they are added to it, and each hash
-- records its share (field ``input_bytes``): every script that ends a request takes that off again
-- (lib_drop_inputs.lua).
-- The fleet's accepted count is this stream's entries added (XINFO STREAM), less requeue.lua's: no counter here
-- (shared/fleet_state.py accepted_count).
-- KEYS[1] request stream, KEYS[2] input bytes counter, then per group: its API key's unfinished set (touched only
-- when the key has a max queued) and one stride per request (``request_keys``: hash, events, packed).
-- ARGV[1] max queue length, ARGV[2] the unfinished sets' TTL (s), ARGV[3] the input budget (bytes); then per group
-- (GROUP_ARGS): API key name, '1' = the key has a max queued, its max queued, the key's share, its request count;
-- then per request (ROW_ARGS): id, spec json, created_at, input image bytes ('' = none), input mask bytes ('' =
-- none), webhook URL ('' = none), the stream events it subscribes to (field webhook_on, shared/webhooks.py).
-- Argument order: shared/submit_call.py (``submit_call``), the one place that builds them.
-- Returns per group: 1 accepted, 0 the queue is full, -1 the key's max queued is reached, -2 the input budget is.
-- The set holds hash keys: the one place a script reads key names from data (the key's own requests, to count).
local stream, inputs_key = KEYS[1], KEYS[2]
local max_len, set_ttl, budget = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local GROUP_ARGS, ROW_ARGS = 5, 7

local queued = redis.call('XLEN', stream)  -- read once: only this call adds to it meanwhile (group by group)

-- the refusal (0, -1, -2) of a group of n requests, or nil
local function refusal(unfinished_set, has_max_queued, max_queued, n)
  if queued + n > max_len then return 0 end
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
  return nil
end

local function queue(request, a, owner, unfinished_set, has_max_queued)
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
  if ARGV[a + 5] ~= '' then  -- webhook (shared/webhooks.py)
    field('webhook', ARGV[a + 5])
    field('webhook_on', ARGV[a + 6])
  end
  redis.call('HSET', hash, unpack(fields))  -- one write of everything it records
  redis.call('XADD', request.events, '*', 'event', STATUS.queued)
end

local out, key_at, a, held = {}, 3, 4, nil  -- held: the input bytes counter once read
while a <= #ARGV do
  local key_name, has_max_queued, max_queued, share = ARGV[a], ARGV[a + 1] == '1', ARGV[a + 2], ARGV[a + 3]
  local n, unfinished_set = tonumber(ARGV[a + 4]), KEYS[key_at]
  local first = a + GROUP_ARGS
  local inputs = 0
  for j = 1, n do
    local r = first + (j - 1) * ROW_ARGS
    inputs = inputs + #ARGV[r + 3] + #ARGV[r + 4]
  end
  local outcome = refusal(unfinished_set, has_max_queued, max_queued, n)
  if not outcome and inputs > 0 and budget ~= '' then
    held = held or tonumber(redis.call('GET', inputs_key) or '0')
    if held + inputs > tonumber(budget) then outcome = -2 end
  end
  if not outcome then
    local owner = {}  -- every entry's and hash's owner fields: the key's name and share (the fair order's flow)
    if key_name ~= '' then
      owner = {'key', key_name}
      if share ~= '' then table.insert(owner, 'share'); table.insert(owner, share) end
    end
    for j = 1, n do
      queue(request_keys(key_at + 1 + (j - 1) * REQUEST_STRIDE), first + (j - 1) * ROW_ARGS, owner, unfinished_set,
            has_max_queued)
    end
    queued = queued + n
    if has_max_queued then redis.call('EXPIRE', unfinished_set, set_ttl) end
    if inputs > 0 then
      redis.call('INCRBY', inputs_key, inputs)
      if held then held = held + inputs end
    end
    outcome = 1
  end
  table.insert(out, outcome)
  a, key_at = first + n * ROW_ARGS, key_at + 1 + n * REQUEST_STRIDE
end
return out
