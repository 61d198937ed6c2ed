"""Every Redis key name and Lua script of fusefleet, in one place.

Layout (``P`` is ``Settings.key_prefix``):

==============================  ======  =====================================================================
key                             type    contents
==============================  ======  =====================================================================
``P:requests``                  stream  one entry per accepted request (fields ``id``, ``spec``); consumer group
                                        ``scheduler``; an entry is acked and deleted once its request is in a batch
``P:events``                    stream  wake-ups for the scheduler (``batch_done``, ``worker_up``), capped length
``P:req:{id}``                  hash    request state: spec, status, seed, batch_id, batch_size, step, total,
                                        error_type, error_message, images, worker, abort, *_at timestamps
``P:img:{id}:{k}``              string  PNG bytes of image k of a request (TTL ``result_ttl_s``)
``P:batch:{id}``                hash    ids (space separated), created_at, attempts, republished (attempt)
``P:batch:{id}:lock``           string  token of the worker running the batch (TTL, renewed by heartbeats)
``P:inflight``                  zset    batch ids published and not finished, scored by publish time (ms)
``P:workers``                   zset    live worker node names, scored by last heartbeat (ms)
``P:scheduler:lease``           string  token of the active scheduler (PX lease)
``P:finished``                  channel pub/sub: the id of every request that just reached a terminal status
==============================  ======  =====================================================================

Every status change goes through a script below, so each is atomic and only moves forward.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULER_GROUP = "scheduler"
SCHEDULER_CONSUMER = "active"  # one consumer name: a new leader inherits its predecessor's pending entries
EVENTS_MAXLEN = 1000


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """Key names under one prefix."""

    prefix: str = "fusefleet"

    @property
    def requests(self) -> str:
        return f"{self.prefix}:requests"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def inflight(self) -> str:
        return f"{self.prefix}:inflight"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def scheduler_lease(self) -> str:
        return f"{self.prefix}:scheduler:lease"

    @property
    def finished(self) -> str:
        return f"{self.prefix}:finished"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}:req:{request_id}"

    def image(self, request_id: str, index: int) -> str:
        return f"{self.prefix}:img:{request_id}:{index}"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def batch_lock(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:lock"


# Submit requests atomically: state hash + stream entry, refused as a whole when the queue is full.
# KEYS[1] stream, KEYS[2..] request hashes.  ARGV[1] max queue length, then per request: id, spec json,
# created_at.  Returns 1 when accepted, 0 when the queue is full.
SUBMIT = """
if redis.call('XLEN', KEYS[1]) + #KEYS - 1 > tonumber(ARGV[1]) then return 0 end
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 3
  redis.call('HSET', KEYS[i], 'spec', ARGV[a + 1], 'status', 'queued', 'created_at', ARGV[a + 2])
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[a], 'spec', ARGV[a + 1])
end
return 1
"""

# Move queued requests into one batch (the only way into a batch), fenced by the scheduler lease.
# KEYS[1] lease, KEYS[2] batch hash, KEYS[3] inflight zset, KEYS[4..] request hashes.
# ARGV[1] lease token, ARGV[2] batch id, ARGV[3] now (s), ARGV[4] now (ms), then the request ids (KEYS order).
# Returns the ids that joined (queued and not aborted), or -1 when the lease is not ours.
SCHEDULE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local joined = {}
local joined_keys = {}
for i = 4, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort')
  if st[1] == 'queued' and not st[2] then
    table.insert(joined, ARGV[i + 1])
    table.insert(joined_keys, KEYS[i])
  end
end
if #joined == 0 then return joined end
for _, k in ipairs(joined_keys) do
  redis.call('HSET', k, 'status', 'scheduled', 'batch_id', ARGV[2], 'batch_size', #joined, 'scheduled_at', ARGV[3])
end
redis.call('HSET', KEYS[2], 'ids', table.concat(joined, ' '), 'created_at', ARGV[3], 'attempts', 0)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
return joined
"""

# A worker takes a batch: lock it, count the attempt, move its requests to running.
# KEYS[1] batch lock, KEYS[2] batch hash, KEYS[3..] request hashes.
# ARGV[1] lock token, ARGV[2] lock ttl (ms), ARGV[3] batch id, ARGV[4] now (s), ARGV[5] worker name,
# ARGV[6] max attempts, ARGV[7] result ttl (s), ARGV[8] finished channel, then the request ids (KEYS order).
# Returns {-1, pttl} when another worker holds the lock, else {attempts, id1, status1, spec1, id2, ...} with
# the status each request has after the claim (running = this worker runs it) and, for running ones, the spec.
CLAIM = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {-1, redis.call('PTTL', KEYS[1])}
end
local attempts = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
local out = {attempts}
for i = 3, #KEYS do
  local id = ARGV[i + 6]
  local st = redis.call('HMGET', KEYS[i], 'status', 'batch_id', 'abort', 'spec')
  local status = st[1]
  local spec = ''
  if (status == 'scheduled' or status == 'running') and st[2] == ARGV[3] then
    if st[3] then
      status = 'aborted'
      redis.call('HSET', KEYS[i], 'status', status, 'finished_at', ARGV[4])
      redis.call('EXPIRE', KEYS[i], ARGV[7])
      redis.call('PUBLISH', ARGV[8], id)
    elseif attempts > tonumber(ARGV[6]) then
      status = 'failed'
      redis.call('HSET', KEYS[i], 'status', status, 'finished_at', ARGV[4], 'error_type', 'WorkerLost',
                 'error_message', 'the batch ended its worker ' .. (attempts - 1) .. ' times')
      redis.call('EXPIRE', KEYS[i], ARGV[7])
      redis.call('PUBLISH', ARGV[8], id)
    else
      status = 'running'
      spec = st[4]
      redis.call('HSET', KEYS[i], 'status', status, 'started_at', ARGV[4], 'worker', ARGV[5], 'step', 0)
    end
  end
  table.insert(out, id)
  table.insert(out, status or 'missing')
  table.insert(out, spec)
end
return out
"""

# Record denoising progress and read abort flags in one round trip.
# KEYS request hashes; ARGV[1] step, ARGV[2] total. Returns one abort flag (0/1) per key.
PROGRESS = """
local out = {}
for i = 1, #KEYS do
  local st = redis.call('HMGET', KEYS[i], 'status', 'abort')
  if st[1] == 'running' then redis.call('HSET', KEYS[i], 'step', ARGV[1], 'total', ARGV[2]) end
  out[i] = st[2] and 1 or 0
end
return out
"""

# End one running request. An abort flag wins over success: the images are then not stored.
# KEYS[1] request hash, KEYS[2..] image keys. ARGV[1] outcome (succeeded|failed), ARGV[2] now (s),
# ARGV[3] ttl (s), ARGV[4] error type, ARGV[5] error message, ARGV[6] finished channel, ARGV[7] request id,
# ARGV[8..] PNG bytes (KEYS[2..] order).
# Returns the final status.
FINISH = """
local st = redis.call('HMGET', KEYS[1], 'status', 'abort')
if st[1] ~= 'running' then return st[1] or 'missing' end
local status = ARGV[1]
if st[2] then status = 'aborted' end
if status == 'succeeded' then
  for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[i + 6], 'EX', ARGV[3]) end
  redis.call('HSET', KEYS[1], 'images', #KEYS - 1)
elseif status == 'failed' then
  redis.call('HSET', KEYS[1], 'error_type', ARGV[4], 'error_message', ARGV[5])
end
redis.call('HSET', KEYS[1], 'status', status, 'finished_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return status
"""

# Abort a request. Not yet running: aborted at once. Running: flagged, the worker ends it.
# KEYS[1] request hash. ARGV[1] now (s), ARGV[2] ttl (s), ARGV[3] finished channel, ARGV[4] request id.
# Returns the status after the call, or false if unknown.
ABORT = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if status == 'succeeded' or status == 'failed' or status == 'aborted' then return status end
redis.call('HSET', KEYS[1], 'abort', 1)
if status == 'queued' or status == 'scheduled' then
  redis.call('HSET', KEYS[1], 'status', 'aborted', 'finished_at', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 'aborted'
end
return status
"""

# A worker is done with a batch: free its slot, drop its lock (if still ours) and wake the scheduler.
# KEYS[1] batch lock, KEYS[2] inflight, KEYS[3] events. ARGV[1] lock token, ARGV[2] batch id, ARGV[3] maxlen.
BATCH_DONE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'batch_done', 'batch_id', ARGV[2])
return 1
"""

# Find batches whose worker died mid-run: claimed (attempts >= 1), still in flight, lock lapsed (a live worker
# renews it every heartbeat). Each attempt is reported once (``republished`` remembers it).
# KEYS[1] inflight. ARGV[1] key prefix. Returns the ids of batches to publish again.
ORPHANS = """
local out = {}
for _, batch_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local batch = ARGV[1] .. ':batch:' .. batch_id
  local st = redis.call('HMGET', batch, 'attempts', 'republished')
  local attempts = tonumber(st[1] or '0')
  if attempts >= 1 and st[2] ~= st[1] and redis.call('EXISTS', batch .. ':lock') == 0 then
    redis.call('HSET', batch, 'republished', st[1])
    table.insert(out, batch_id)
  end
end
return out
"""

# Extend a token-guarded key's TTL (scheduler lease, batch lock). KEYS[1] key. ARGV[1] token, ARGV[2] ttl (ms).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# Delete a token-guarded key if it is still ours. KEYS[1] key. ARGV[1] token.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
