-- Submit requests atomically: state hash + stream entry, refused as a whole when the queue is full.
-- An image-conditioned request's input image and mask are stored in its hash (fields input_image, input_mask), so
-- they live and expire with it; the stream entry carries only the spec, and the hash remembers the entry's id
-- (``entry``) so that aborting a queued request frees its place in the queue at once.
-- KEYS[1] stream, KEYS[2..] request hashes.  ARGV[1] max queue length, then per request: id, spec json,
-- created_at, input image PNG ('' = none), input mask PNG ('' = none).  Returns 1 when accepted, 0 when full.
if redis.call('XLEN', KEYS[1]) + #KEYS - 1 > tonumber(ARGV[1]) then return 0 end
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 5
  redis.call('HSET', KEYS[i], 'spec', ARGV[a + 1], 'status', 'queued', 'created_at', ARGV[a + 2])
  if ARGV[a + 3] ~= '' then redis.call('HSET', KEYS[i], 'input_image', ARGV[a + 3]) end
  if ARGV[a + 4] ~= '' then redis.call('HSET', KEYS[i], 'input_mask', ARGV[a + 4]) end
  local entry = redis.call('XADD', KEYS[1], '*', 'id', ARGV[a], 'spec', ARGV[a + 1])
  redis.call('HSET', KEYS[i], 'entry', entry)
end
return 1
