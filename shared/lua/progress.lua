-- Record denoising progress and read, per request, whether its row should stop, in one round trip.
-- KEYS request hashes; ARGV[1] step, ARGV[2] total, ARGV[3] claim token.
-- Returns per key: 0 = go on, 1 = aborted, 2 = no longer this claim's (re-claimed by another run, or ended).
local out = {}
for i = 1, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort', 'claim')
  if st[1] ~= 'running' or st[3] ~= ARGV[3] then
    out[i] = 2
  else
    redis.call('HSET', KEYS[i], 'step', ARGV[1], 'total', ARGV[2])
    out[i] = st[2] and 1 or 0
  end
end
return out
