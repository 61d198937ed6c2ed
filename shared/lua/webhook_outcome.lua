-- The webhook dispatcher records what became of one delivery attempt of an outbox entry (scheduler/webhooks.py):
--   delivered: the entry is acked and deleted, the request's retry count (webhook_attempt) dropped;
--   dropped:   the same, and the request records why (webhook_error): its attempts ran out, or its host is refused;
--   superseded: the same, unsent: a progress event with a later event of its request behind it;
--   failed:    the entry stays pending; the request records its failed attempts (webhook_attempt = '<event id> <n>'),
--              so a dispatcher that takes over resumes the count.
-- (These are a delivery's outcomes, not request statuses.)
-- The request's fields are written only while its hash exists (an expired or deleted request is not recreated).
-- Each outcome is counted in the metrics hash (webhooks:delivered, :dropped, :superseded; webhooks:retried for failed).
-- KEYS[1] outbox stream, KEYS[2] request hash, KEYS[3] metrics hash.
-- ARGV[1] consumer group, ARGV[2] outbox entry id, ARGV[3] outcome (delivered|dropped|superseded|failed),
-- ARGV[4] webhook_error (dropped) or webhook_attempt (failed).
-- Returns 1.
local outbox, hash, metrics = KEYS[1], KEYS[2], KEYS[3]
local group, entry, outcome, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local RETRY = 'failed'  -- the outcome that keeps the entry (scheduler/webhooks.py Outcome)

if outcome == RETRY then
  if redis.call('EXISTS', hash) == 1 then redis.call('HSET', hash, 'webhook_attempt', detail) end
  redis.call('HINCRBY', metrics, 'webhooks:retried', 1)
  return 1
end
redis.call('XACK', outbox, group, entry)
redis.call('XDEL', outbox, entry)
if redis.call('EXISTS', hash) == 1 then
  redis.call('HDEL', hash, 'webhook_attempt')
  if outcome == 'dropped' then redis.call('HSET', hash, 'webhook_error', detail) end
end
redis.call('HINCRBY', metrics, 'webhooks:' .. outcome, 1)
return 1
