-- Step mode (docs/step_mode.md): register a worker's running set again after its registration was swept with a
-- late heartbeat (free_slots.lua) while the set ran on: the set holds the worker's slot again, takes joins and
-- evictions again, and is counted with ``rows`` requests. While a set is not registered no join, swap or eviction
-- reaches its inbox (step_join.lua, step_swap.lua, step_evict.lua refuse), count-outs and requeues change no count
-- (step_leave.lua, requeue.lua), and only the worker pops its inbox; so the worker's own count of the requests it
-- holds plus those of the batches left in its inbox (``rows``, read by the same thread that pops it, on which
-- this runs) is what the set holds or will absorb, or more than it (a count-out made while this runs was not
-- subtracted), never less: the set never takes joiners past max_num_seqs. ``inbox_len`` guards that reading. The
-- set's id (``P:step:open:{worker}``, written by its open, gone once it closed or was dropped) fences a call that
-- comes late: a set already gone is not registered again.
-- KEYS[1] step sets hash, KEYS[2] step rows hash, KEYS[3] the worker's inbox list, KEYS[4] workers zset,
-- KEYS[5] events stream, KEYS[6] the worker's open set id.
-- ARGV[1] worker, ARGV[2] the set's step key digest (or shared.keys.STEP_SEALED), ARGV[3] rows, ARGV[4] the
-- inbox's length when rows was counted, ARGV[5] events maxlen, ARGV[6] the set's id.
-- Returns 1 when registered, 0 when the set is registered already, -2 when the set is gone (closed or dropped),
-- -1 when the worker is not live or its inbox changed since it was read (try again); nothing written but with 1.
local step_sets, step_rows, inbox, workers, wake_ups, open = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local worker, value, rows, inbox_len, events_maxlen = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local set_id = ARGV[6]

if redis.call('GET', open) ~= set_id then return -2 end
if redis.call('HEXISTS', step_sets, worker) == 1 then return 0 end
if not redis.call('ZSCORE', workers, worker) or redis.call('LLEN', inbox) ~= inbox_len then return -1 end
redis.call('HSET', step_sets, worker, value)
redis.call('HSET', step_rows, worker, rows)
redis.call('XADD', wake_ups, 'MAXLEN', '~', events_maxlen, '*', 'type', 'room_free', 'worker', worker)
return 1
