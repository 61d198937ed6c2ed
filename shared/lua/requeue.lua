-- Step mode (docs/step_mode.md, "Priorities and preemption"): put a running request back in the queue, evicted from
-- its worker's running set at a step boundary so that a request of a higher level takes its place. The one backward
-- move of the status machine (docs/architecture.md): running -> queued, only here and only for the claim that runs
-- it (its token, as finish.lua). Its progress restarts (step 0; nothing of the run is kept: it runs again from its
-- seed and gives the same images), its batch fields and claim are cleared (its old batch no longer counts it: the
-- reaper and batch_done.lua look for requests scheduled or running in that batch), and it gets a new entry in the
-- request stream (with ``requeued`` = 1: the scheduler puts it at the front of its level; and ``arrival`` = its first
-- stream entry id, kept in its hash across requeues: requeued requests keep their original order there; and its
-- owner, ``key`` and ``share``, from its hash, as submit.lua gave them: its flow in the fair order) and a
-- ``requeued`` event (+ ``worker``, ``step`` it had reached). In the same step the worker's set counts it out
-- (``P:step:rows``), its level leaves the set's levels hash, the scheduler is woken (its room is free for the
-- request that preempts it) and the metrics count it (``requeued``).
-- A request flagged aborted is not requeued: the worker ends it aborted (reply 2).
-- A retry of a call whose reply was lost (an outage) finds field ``requeued`` = its token and answers 1 again.
-- KEYS[1] request stream, KEYS[2] step rows hash, KEYS[3] the worker's step levels hash, KEYS[4] events stream,
-- KEYS[5] metrics hash, KEYS[6..8] the request's stride (``request_keys``).
-- ARGV[1] claim token, ARGV[2] worker, ARGV[3] request id, ARGV[4] events maxlen.
-- Returns 1 when requeued, 2 when flagged aborted (still running: end it), 0 when not running under this claim.
local stream, step_rows, levels, wake_ups, metrics, request = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  request_at(5, 1)
local token, worker, request_id, events_maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local hash = request.hash
local st = redis.call('HMGET', hash, 'status', 'claim', 'abort', 'spec', 'step', 'requeued', 'arrival', 'entry',
  'key', 'share')
if st[1] ~= STATUS.running or st[2] ~= token then
  if st[6] == token then return 1 end
  return 0
end
if st[3] then return 2 end
redis.call('HDEL', hash, 'claim', 'batch_id', 'batch_size', 'scheduled_at', 'started_at', 'worker', 'total')
local arrival = st[7] or st[8] or '0-0'  -- its first stream entry (submit.lua's): its place among the requeued
local owner = {}
if st[9] then owner = {'key', st[9]} end
if st[9] and st[10] then table.insert(owner, 'share'); table.insert(owner, st[10]) end
local entry = redis.call('XADD', stream, '*', 'id', request_id, 'spec', st[4], 'requeued', '1', 'arrival', arrival,
  unpack(owner))
redis.call('HSET', hash, 'status', STATUS.queued, 'step', 0, 'entry', entry, 'requeued', token, 'arrival', arrival)
redis.call('XADD', request.events, '*', 'event', 'requeued', 'worker', worker, 'step', st[5] or '0')
if redis.call('HEXISTS', step_rows, worker) == 1 then redis.call('HINCRBY', step_rows, worker, -1) end
redis.call('HDEL', levels, request_id)
redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'room_free', 'worker', worker)
redis.call('HINCRBY', metrics, 'requeued', 1)  -- shared/metrics.py
return 1
