-- Submit requests atomically: state hash + stream entry, refused as a whole when the queue is full.
-- KEYS[1] stream, KEYS[2..] request hashes.  ARGV[1] max queue length, then per request: id, spec json,
-- created_at.  Returns 1 when accepted, 0 when the queue is full.
if redis.call('XLEN', KEYS[1]) + #KEYS - 1 > tonumber(ARGV[1]) then return 0 end
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 3
  redis.call('HSET', KEYS[i], 'spec', ARGV[a + 1], 'status', 'queued', 'created_at', ARGV[a + 2])
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[a], 'spec', ARGV[a + 1])
end
return 1
