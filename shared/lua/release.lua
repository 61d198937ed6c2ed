-- Delete a token-guarded key (scheduler lease, webhook lease) if it is still ours.
-- KEYS[1] the key. ARGV[1] token.
-- Returns 1 when deleted, 0 when it was not ours (or gone).
local guarded, token = KEYS[1], ARGV[1]

if redis.call('GET', guarded) == token then return redis.call('DEL', guarded) end
return 0
