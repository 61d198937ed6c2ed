-- Delete a finished request: its state and its event stream go at once, its images become due for deletion now
-- (the caller deletes them and confirms; if it cannot, the sweeper does). A request that has not finished is left
-- alone.
-- KEYS[1] results journal, KEYS[2..4] the request's stride (``request_keys``).
-- Returns {} when unknown, {status} when it has not finished, {'deleted', key1, key2, ...} when deleted.
local journal, request = KEYS[1], request_at(1, 1)

local st = redis.call('HMGET', request.hash, 'status', 'results')
if not st[1] then return {} end
if not TERMINAL[st[1]] then return {st[1]} end
local out = {'deleted'}
for key in string.gmatch(st[2] or '', '%S+') do
  redis.call('ZADD', journal, 'XX', 0, key)
  table.insert(out, key)
end
redis.call('DEL', request.hash)
redis.call('DEL', request.events)
return out
