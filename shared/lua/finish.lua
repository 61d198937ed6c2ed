-- End running requests of one claim, in one call, each only for the claim that runs it (a late writer from an
-- earlier claim is ignored). A succeeded request's images are already in the result store under the given keys;
-- they must still be in the results journal (recorded at claim time, see results_record.lua), else the sweeper may
-- have deleted them and the request fails with ResultLost. Kept keys become due for deletion with the request
-- (now + ttl); an abort flag wins over success, and then the keys become due at once. What ending one does besides
-- (input images dropped, the event, the webhook outbox, the wake-up, the metrics) is ``end_request``'s
-- (lib_end_request.lua, prepended). Per call, not per request: one ZMSCORE and one ZADD of the journal
-- (pages of PAGE keys), one PUBLISH of the ended ids on the finished channel, one HINCRBY per metrics counter;
-- no TIME: the journal's due times count from the Redis time of the first terminal event (its entry id).
-- KEYS[1..3] ``end_keys`` (metrics, webhooks, inputs), KEYS[4] results journal, then one stride per request
-- (``request_keys``).
-- ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] claim token, then per request (KEYS order):
-- its id, outcome (succeeded|failed), error type, error message, '1' when its spec needs no input image ('' =
-- unknown: its input fields are deleted whatever), the count of its result keys and those keys (in image order);
-- then, optionally, the forward's last step and its total (the step reporter's last write, folded in: a request
-- that ends succeeded or failed gets them in its HSET and, when its step was not yet that, the ``progress`` event
-- and webhook entry progress.lua would have written, just before its terminal event).
-- Returns per request (KEYS order) its status after the call (unchanged when it is not running under this claim;
-- 'missing' when it has no hash).
local ending, journal = end_keys(1), KEYS[4]
local FIXED, PAGE = 4, 1000
local now, ttl, channel, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local rows, a = {}, 5
for j = 1, request_count(FIXED) do
  local row = {request = request_at(FIXED, j), id = ARGV[a], outcome = ARGV[a + 1], error_type = ARGV[a + 2],
               error_message = ARGV[a + 3], none_held = ARGV[a + 4] == '1', results = {}}
  for i = 1, tonumber(ARGV[a + 5]) do row.results[i] = ARGV[a + 5 + i] end
  a = a + 6 + #row.results
  rows[j] = row
end
local final_step, final_total = ARGV[a], ARGV[a + 1]  -- nil: no step to write

-- the forward's last step, as progress.lua writes it (the event before the terminal one)
local function last_progress(row, st)
  if not final_step or row.status == STATUS.aborted then return end
  for _, value in ipairs({'step', final_step, 'total', final_total}) do table.insert(row.known.fields, value) end
  if st[6] == final_step then return end
  local event = redis.call('XADD', row.request.events, 'MAXLEN', REQUEST_EVENTS_MAXLEN, '*', 'event', 'progress',
                           'step', final_step, 'total', final_total)
  if st[4] and string.find(st[4], ' progress ', 1, true) then
    redis.call('XADD', ending.webhooks, '*', 'id', row.id, 'event', 'progress', 'entry', event,
               'step', final_step, 'total', final_total)
  end
end

-- each key of ``keys`` with its score (false where it is not in the journal), ZMSCORE a page at a time
local function journaled(keys)
  local scores = {}
  for first = 1, #keys, PAGE do
    local page = redis.call('ZMSCORE', journal, unpack(keys, first, math.min(first + PAGE - 1, #keys)))
    for i, score in ipairs(page) do scores[first + i - 1] = score end
  end
  return scores
end

local candidates = {}  -- the keys of the requests that may succeed, in row order
for _, row in ipairs(rows) do
  local st = redis.call('HMGET', row.request.hash, 'status', 'abort', 'claim', 'webhook_on', INPUT_COUNT_FIELD,
                       'step')
  row.status = st[1] or 'missing'
  if st[1] == STATUS.running and st[3] == token then
    row.ends, row.known = true, {webhook_on = st[4], counted = st[5], none_held = row.none_held, fields = {}}
    row.st = st
    row.status = st[2] and STATUS.aborted or row.outcome
    if row.status == STATUS.succeeded then
      for _, key in ipairs(row.results) do table.insert(candidates, key) end
    end
  end
end
local scores, c = journaled(candidates), 0
for _, row in ipairs(rows) do
  if row.ends and row.status == STATUS.succeeded then
    for _, key in ipairs(row.results) do
      c = c + 1
      if not scores[c] and row.status == STATUS.succeeded then
        row.status, row.error_type = STATUS.failed, 'ResultLost'
        row.error_message = 'its image ' .. key .. ' was swept from the result store before the run finished '
          .. '(the run outlasted result_orphan_grace_s)'
      end
    end
  end
  if row.ends then
    row.due_after_ms = 0  -- its keys fall due at once, or with the request's state when it succeeded
    if row.status == STATUS.succeeded then
      row.due_after_ms = tonumber(ttl) * 1000
      row.known.fields = {'images', #row.results, 'results', table.concat(row.results, ' ')}
    elseif row.status == STATUS.failed then
      row.known.fields = {'error_type', row.error_type, 'error_message', row.error_message}
      row.known.error_type = row.error_type
    end
    last_progress(row, row.st)
  end
end
local tally, out, now_in_ms = ended_tally(), {}, nil
for j, row in ipairs(rows) do
  if row.ends then
    local event = end_request(row.request, ending, row.id, row.status, STATUS.running, now, ttl, channel, row.known,
                              tally)
    now_in_ms = now_in_ms or entry_ms(event)  -- the Redis time (lib_time.lua)
  end
  out[j] = row.status
end
local due = {}  -- ZADD XX arguments: score, key, ...
for _, row in ipairs(rows) do
  if row.ends then
    for _, key in ipairs(row.results) do
      table.insert(due, now_in_ms + row.due_after_ms)
      table.insert(due, key)
    end
  end
end
for first = 1, #due, 2 * PAGE do
  redis.call('ZADD', journal, 'XX', unpack(due, first, math.min(first + 2 * PAGE - 1, #due)))
end
flush_ended(ending, tally, channel)
return out
