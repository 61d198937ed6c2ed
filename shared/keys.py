"""Every Redis key name and Lua script of fusefleet, in one place.

Layout (``P`` is ``Settings.key_prefix``):

==============================  ======  =====================================================================
key                             type    contents
==============================  ======  =====================================================================
``P:requests``                  stream  one entry per accepted request (fields ``id``, ``spec``); consumer group
                                        ``scheduler``; an entry is acked and deleted once its request is in a batch
``P:events``                    stream  wake-ups for the scheduler (``batch_done``, ``worker_up``), capped length
``P:req:{id}``                  hash    request state: spec, status, seed, batch_id, batch_size, step, total,
                                        error_type, error_message, images (count), results (result-store keys,
                                        space separated), worker, abort, claim (token of the run that may
                                        finish it), entry (stream id), arrival (its first stream id, once
                                        requeued), input_image, input_mask and input_bytes
                                        (their size counted in ``P:inputs:bytes``) until it
                                        ends, evicted_at, *_at timestamps, key (the API key's name, when
                                        the api has keys), deadline (spec created_at + timeout_s, written
                                        when it joins a batch, for the in-flight deadline sweep), webhook,
                                        webhook_on, webhook_progress_ms, webhook_attempt, webhook_error (a
                                        request with a webhook, ``shared.webhooks``); TTL once terminal
``P:req:{id}:events``           stream  the request's events, in order, atomic with its state (written by the Lua
                                        script of each change; read by ``GET /v1/requests/{id}/events``): field
                                        ``event`` = queued, scheduled (+ ``batch_id``, ``batch_size``), running
                                        (+ ``worker``), progress (+ ``step``, ``total``; throttled and capped in
                                        ``progress.lua``), then one of succeeded, failed, aborted; the scripts name
                                        it as the hash key plus ``:events``; expires and is deleted with the hash.
                                        Packed when it ends: a stream reserves 4 KiB for its entries, so each
                                        terminal script appends the last event, copies the stream (COPY keeps
                                        the bytes used, ~0.8 KiB) and renames the copy (``...:events:packed``,
                                        inside the script) over it; entry ids are kept, blocked readers served
``P:inputs:bytes``              string  bytes of the input images (``input_image``, ``input_mask``) held by
                                        unfinished requests: added by ``submit.lua`` (under
                                        ``max_queued_input_bytes``, each request's share in its ``input_bytes``),
                                        taken off by the one function that drops them (``lib_drop_inputs.lua``,
                                        in every script that ends a request: the share recorded, none without)
``P:results:journal``           zset    result-store key -> when its object may be deleted (Redis time, ms):
                                        a run's keys are recorded before it stores them (due after
                                        ``result_orphan_grace_s``), a succeeded request's keep until it expires
``P:results:deleting``          zset    result-store keys the sweeper took for deletion -> when to retry
``P:result:{key}``              string  an image's bytes, Redis result store only (``shared.results``); with
                                        ``P:results:redis:order`` (zset, put time), ``...:sizes`` (hash) and
                                        ``...:used`` (bytes in use, under ``result_redis_max_bytes``)
``P:batch:{id}``                hash    ids (space separated), created_at, attempts (claims that ran something),
                                        seq, published_seq, claimed_seq (order of publications and claims),
                                        published_ms (Redis server time), lost:{request id} (runs of the request
                                        that were lost: ``claim.lua`` splits on them), lost_alone:{request id}
                                        (those that ran it alone: it fails WorkerLost at max_batch_attempts),
                                        ran (requests the last claim that ran something ran); TTL once out of
                                        flight
``P:batch:{id}:lock``           string  claim token of the run holding the batch (TTL, renewed by heartbeats)
``P:inflight``                  zset    batches with unfinished requests, scored by first publish time (ms)
``P:storing``                   zset    batches in flight that occupy no worker slot: their forward is over while
                                        their run stores the outputs, or they run in a step-mode set (which holds
                                        the slot), scored by when (Redis time, ms)
``P:step:sets``                 hash    step mode: worker -> step key digest of its open running set (``sealed``
                                        once it takes no more joins); each open set holds its worker's slot
``P:step:rows``                 hash    step mode: worker -> requests in its open set or sent to it
``P:step:inbox:{worker}``       list    step mode: batch messages sent to the worker's running set
                                        (``step_join.lua``), and evictions (``step_evict.lua``: a
                                        ``StepEviction``), read at its next step boundary
``P:step:levels:{worker}``      hash    step mode: request id -> "<priority> <joined ms>" of each request running
                                        in the worker's set, written by the worker when it joins and removed when
                                        it leaves (``requeue.lua`` too); read by the scheduler to preempt; TTL
                                        ``batch_time_limit_s``, renewed with each write
``P:step:left:{worker}``        string  step mode: the token of the worker's last count-out (``step_leave.lua``),
                                        so a retried one is not counted twice; TTL ``batch_time_limit_s``
``P:workers``                   zset    live worker node names, scored by last heartbeat (Redis time, ms)
``P:capabilities``              hash    worker node name -> WorkerCapabilities JSON (model, pipeline, tasks);
                                        swept with the worker's heartbeat entry
``P:worker:stuck:{name}``       string  why worker ``name`` is quarantined (its result store hung under it):
                                        ``heartbeat.lua`` announces no slot for it until it expires
                                        (``worker_quarantine_s``)
``P:scheduler:lease``           string  token of the active scheduler (PX lease)
``P:scheduler:aborted``         set     ids of requests aborted while queued (``abort.lua``), taken (SPOP) by the
                                        active scheduler each round to drop them from its memory; at most
                                        ``max_queue_len`` (later ones are left out: the scheduler's status check
                                        of its head window finds them); TTL ``result_ttl_s`` from the last added
``P:scheduler:queued``          string  the active scheduler's in-memory queue length (requests read, not yet
                                        dispatched), written at each lease renewal (PX lease)
``P:finished``                  channel pub/sub: the id of every request that just reached a terminal status
``P:metrics``                   hash    fleet-wide counters and histogram buckets (fields: ``shared.metrics``),
                                        incremented by the scripts of each transition (they name it as the
                                        prefix of a request hash key plus ``:metrics``) and by the workers
``P:metrics:recent``            hash    images produced per second of Redis time, a ring of the last 64 s
                                        (``metrics_add.lua``; read by ``fusefleet status``)
``P:apikey:{name}:bucket``      hash    API key ``name``'s rate-limit token bucket: tokens, at_ms (Redis time);
                                        ``rate_limit.lua``; expires once it would be full again
``P:apikey:{name}:unfinished``  set     hash keys of API key ``name``'s requests that may be unfinished (a key
                                        with a max queued only); ``submit.lua`` prunes the finished ones and
                                        counts the rest; expires ``result_ttl_s`` after the key's last submission
``P:webhooks``                  stream  the webhook outbox: one entry per event a request's webhook subscribed to
                                        (``id``, ``event``, ``entry`` = its event stream id, + ``worker`` or
                                        ``step``, ``total``), appended by the script that writes the event (they
                                        derive it from the request hash key, as ``:metrics``); consumer group
                                        ``webhooks``, consumer ``active``; acked and deleted once delivered or
                                        dropped (``scheduler.webhooks``)
``P:webhooks:lease``            string  token of the active webhook dispatcher (PX ``scheduler_lease_ms``)
==============================  ======  =====================================================================

Every status change goes through a Lua script of ``shared/lua/`` (one file each, documented at its top), so
each is atomic and only moves forward, but one: ``requeue.lua`` moves a running request back to queued (step-mode
preemption, for the claim that runs it). Invariants the scripts keep together:

* a request that is ``scheduled`` or ``running`` belongs to a batch in ``P:inflight`` (``schedule.lua`` adds
  both at once; ``batch_done.lua`` and ``reap.lua`` remove a batch only when none of its requests is left
  unfinished), so the reaper sees every request that could be stranded;
* a request is finished only by the claim that runs it (``claim`` token, checked by ``finish.lua``): a late
  writer whose batch was claimed again after its lock lapsed changes nothing;
* every object a run stores in the result store is in the results journal before it is written
  (``results_record.lua``), so an object is either referenced by a succeeded request or falls due and is
  deleted by the sweeper: a crash between writing bytes and finishing leaves nothing behind for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

SCHEDULER_GROUP = "scheduler"
SCHEDULER_CONSUMER = "active"  # one consumer name: a new leader inherits its predecessor's pending entries
EVENTS_MAXLEN = 1000
STEP_SEALED = "sealed"
"""A worker's ``P:step:sets`` field once its running set takes no more joins (a value no step key digest has)."""
WEBHOOK_GROUP = "webhooks"
WEBHOOK_CONSUMER = "active"  # one consumer name, as the scheduler's: a new dispatcher inherits the pending entries


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
    def storing(self) -> str:
        return f"{self.prefix}:storing"

    @property
    def step_sets(self) -> str:
        return f"{self.prefix}:step:sets"

    @property
    def step_rows(self) -> str:
        return f"{self.prefix}:step:rows"

    def step_inbox(self, worker: str) -> str:
        return f"{self.prefix}:step:inbox:{worker}"

    def step_levels(self, worker: str) -> str:
        return f"{self.prefix}:step:levels:{worker}"

    def step_left(self, worker: str) -> str:
        return f"{self.prefix}:step:left:{worker}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def capabilities(self) -> str:
        return f"{self.prefix}:capabilities"

    def worker_quarantine(self, worker: str) -> str:
        """Set while ``worker`` is quarantined (``gpu_worker.app``'s retire; TTL ``worker_quarantine_s``)."""
        return f"{self.prefix}:worker:stuck:{worker}"

    @property
    def scheduler_aborted(self) -> str:
        return f"{self.prefix}:scheduler:aborted"

    @property
    def scheduler_queued(self) -> str:
        return f"{self.prefix}:scheduler:queued"

    @property
    def scheduler_lease(self) -> str:
        return f"{self.prefix}:scheduler:lease"

    @property
    def finished(self) -> str:
        return f"{self.prefix}:finished"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}:req:{request_id}"

    def request_events(self, request_id: str) -> str:
        """The event stream of a request: its hash key plus ``:events`` (the Lua scripts derive it so)."""
        return f"{self.request(request_id)}:events"

    @property
    def input_bytes(self) -> str:
        """Bytes of input images held by unfinished requests; the Lua scripts derive it from a request hash key."""
        return f"{self.prefix}:inputs:bytes"

    @property
    def results_journal(self) -> str:
        return f"{self.prefix}:results:journal"

    @property
    def results_deleting(self) -> str:
        return f"{self.prefix}:results:deleting"

    def result(self, key: str) -> str:
        """Where the Redis result store keeps the object of result-store key ``key``."""
        return f"{self.prefix}:result:{key}"

    @property
    def redis_results_order(self) -> str:
        return f"{self.prefix}:results:redis:order"

    @property
    def redis_results_sizes(self) -> str:
        return f"{self.prefix}:results:redis:sizes"

    @property
    def redis_results_used(self) -> str:
        return f"{self.prefix}:results:redis:used"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def batch_lock(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:lock"

    def api_key_bucket(self, name: str) -> str:
        return f"{self.prefix}:apikey:{name}:bucket"

    def api_key_unfinished(self, name: str) -> str:
        return f"{self.prefix}:apikey:{name}:unfinished"

    @property
    def metrics(self) -> str:
        """Fleet-wide counters (``shared.metrics``); the Lua scripts derive it from a request hash key."""
        return f"{self.prefix}:metrics"

    @property
    def metrics_recent(self) -> str:
        return f"{self.prefix}:metrics:recent"

    @property
    def webhooks(self) -> str:
        """The webhook outbox (``shared.webhooks``); the Lua scripts derive it from a request hash key."""
        return f"{self.prefix}:webhooks"

    @property
    def webhooks_lease(self) -> str:
        return f"{self.prefix}:webhooks:lease"


def _lua(name: str, *libraries: str) -> str:
    """The script ``shared/lua/{name}.lua``, after the library files it uses (Redis scripts cannot import)."""
    folder = files("shared").joinpath("lua")
    return "\n".join(folder.joinpath(f"{part}.lua").read_text(encoding="utf-8") for part in (*libraries, name))


SUBMIT = _lua("submit")
SCHEDULE = _lua("schedule")
CLAIM = _lua("claim", "lib_drop_inputs", "lib_end_request", "lib_split_plan")
PROGRESS = _lua("progress")
FINISH = _lua("finish", "lib_drop_inputs", "lib_end_request")
FAIL = _lua("fail", "lib_drop_inputs", "lib_end_request", "lib_fail_request")
ABORT = _lua("abort", "lib_drop_inputs", "lib_end_request")
EXPIRE = _lua("expire", "lib_drop_inputs", "lib_end_request", "lib_fail_request")
BATCH_DONE = _lua("batch_done")
FORWARD_DONE = _lua("forward_done")
REAP = _lua("reap")
STAMP_PUBLISHED = _lua("stamp_published")
HEARTBEAT = _lua("heartbeat")
FREE_SLOTS = _lua("free_slots")
STEP_JOIN = _lua("step_join")
STEP_CLOSE = _lua("step_close")
STEP_LEAVE = _lua("step_leave")
STEP_SEAL = _lua("step_seal")
STEP_EVICT = _lua("step_evict")
REQUEUE = _lua("requeue")
RENEW = _lua("renew")
RELEASE = _lua("release")
GIVE_BACK = _lua("give_back")
RESULTS_RECORD = _lua("results_record")
RESULTS_DUE = _lua("results_due")
FORGET = _lua("forget")
REDIS_RESULT_PUT = _lua("redis_result_put")
REDIS_RESULT_DELETE = _lua("redis_result_delete")
RATE_LIMIT = _lua("rate_limit")
METRICS_ADD = _lua("metrics_add")
WEBHOOK_OUTCOME = _lua("webhook_outcome")
