-- Extend a token-guarded key's TTL (scheduler lease, batch lock) if it is still ours.
-- KEYS[1] the key. ARGV[1] token, ARGV[2] ttl (ms).
-- Returns 1 when extended, 0 when it was not ours (or gone).
local guarded, token, ttl_ms = KEYS[1], ARGV[1], ARGV[2]

if redis.call('GET', guarded) == token then return redis.call('PEXPIRE', guarded, ttl_ms) end
return 0
