-- Extend a token-guarded key's TTL (scheduler lease, batch lock). KEYS[1] key. ARGV[1] token, ARGV[2] ttl (ms).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
