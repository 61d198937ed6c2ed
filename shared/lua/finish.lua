-- End one running request, only for the claim that runs it (a late writer from an earlier claim is ignored).
-- An abort flag wins over success: the images are then not stored.
-- KEYS[1] request hash, KEYS[2..] image keys. ARGV[1] outcome (succeeded|failed), ARGV[2] now (s),
-- ARGV[3] ttl (s), ARGV[4] error type, ARGV[5] error message, ARGV[6] finished channel, ARGV[7] request id,
-- ARGV[8] claim token, ARGV[9..] PNG bytes (KEYS[2..] order).
-- Returns the status after the call (unchanged when the request is not running under this claim).
local st = redis.call('HMGET', KEYS[1], 'status', 'abort', 'claim')
if st[1] ~= 'running' or st[3] ~= ARGV[8] then return st[1] or 'missing' end
local status = ARGV[1]
if st[2] then status = 'aborted' end
if status == 'succeeded' then
  for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[i + 7], 'EX', ARGV[3]) end
  redis.call('HSET', KEYS[1], 'images', #KEYS - 1)
elseif status == 'failed' then
  redis.call('HSET', KEYS[1], 'error_type', ARGV[4], 'error_message', ARGV[5])
end
redis.call('HSET', KEYS[1], 'status', status, 'finished_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return status
