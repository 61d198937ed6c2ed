-- The webhook dispatcher records what became of one delivery attempt of an outbox entry (scheduler/webhooks.py):
--   delivered: the entry is acked and deleted, the request's retry count (webhook_attempt) dropped;
--   dropped:   the same, and the request records why (webhook_error): its attempts ran out, or its host is refused;
--   superseded: the same, unsent: a progress event with a later event of its request behind it;
--   failed:    the entry stays pending; the request records its failed attempts (webhook_attempt = '<event id> <n>'),
--              so a dispatcher that takes over resumes the count.
-- The request's fields are written only while its hash exists (an expired or deleted request is not recreated).
-- Each outcome is counted in the metrics hash (webhooks:delivered, :dropped, :superseded; webhooks:retried for failed).
-- KEYS[1] outbox stream, KEYS[2] request hash, KEYS[3] metrics hash. ARGV[1] consumer group, ARGV[2] outbox entry id,
-- ARGV[3] outcome (delivered|dropped|superseded|failed), ARGV[4] webhook_error (dropped) or webhook_attempt (failed).
-- Returns 1.
if ARGV[3] == 'failed' then
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'webhook_attempt', ARGV[4]) end
  redis.call('HINCRBY', KEYS[3], 'webhooks:retried', 1)
  return 1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HDEL', KEYS[2], 'webhook_attempt')
  if ARGV[3] == 'dropped' then redis.call('HSET', KEYS[2], 'webhook_error', ARGV[4]) end
end
redis.call('HINCRBY', KEYS[3], 'webhooks:' .. ARGV[3], 1)
return 1
