-- Delete a finished request: its state goes at once, its images become due for deletion now (the caller deletes
-- them and confirms; if it cannot, the sweeper does). A request that has not finished is left alone.
-- Its event stream (its hash key .. ':events') goes with its state.
-- KEYS[1] request hash, KEYS[2] results journal.
-- Returns {} when unknown, {status} when it has not finished, {'deleted', key1, key2, ...} when deleted.
local st = redis.call('HMGET', KEYS[1], 'status', 'results')
if not st[1] then return {} end
if st[1] ~= 'succeeded' and st[1] ~= 'failed' and st[1] ~= 'aborted' then return {st[1]} end
local out = {'deleted'}
for key in string.gmatch(st[2] or '', '%S+') do
  redis.call('ZADD', KEYS[2], 'XX', 0, key)
  table.insert(out, key)
end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[1] .. ':events')
return out
