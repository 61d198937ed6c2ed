"""Every Redis key name and Lua script of fusefleet, in one place.

Layout (``P`` is ``Settings.key_prefix``):

==============================  ======  =====================================================================
key                             type    contents
==============================  ======  =====================================================================
``P:requests``                  stream  one entry per accepted request (fields ``id``, ``spec``); consumer group
                                        ``scheduler``; an entry is acked and deleted once its request is in a batch
``P:events``                    stream  wake-ups for the scheduler (``batch_done``, ``worker_up``), capped length
``P:req:{id}``                  hash    request state: spec, status, seed, batch_id, batch_size, step, total,
                                        error_type, error_message, images, worker, abort, claim (token of
                                        the run that may finish it), *_at timestamps; TTL once terminal
``P:img:{id}:{k}``              string  PNG bytes of image k of a request (TTL ``result_ttl_s``)
``P:batch:{id}``                hash    ids (space separated), created_at, attempts (claims that ran something),
                                        seq, published_seq, claimed_seq (order of publications and claims),
                                        published_ms (Redis server time); TTL once out of flight
``P:batch:{id}:lock``           string  claim token of the run holding the batch (TTL, renewed by heartbeats)
``P:inflight``                  zset    batches with unfinished requests, scored by first publish time (ms)
``P:workers``                   zset    live worker node names, scored by last heartbeat (Redis time, ms)
``P:capabilities``              hash    worker node name -> WorkerCapabilities JSON (model, pipeline, tasks);
                                        swept with the worker's heartbeat entry
``P:scheduler:lease``           string  token of the active scheduler (PX lease)
``P:finished``                  channel pub/sub: the id of every request that just reached a terminal status
==============================  ======  =====================================================================

Every status change goes through a Lua script of ``shared/lua/`` (one file each, documented at its top), so
each is atomic and only moves forward. Invariants the scripts keep together:

* a request that is ``scheduled`` or ``running`` belongs to a batch in ``P:inflight`` (``schedule.lua`` adds
  both at once; ``batch_done.lua`` and ``reap.lua`` remove a batch only when none of its requests is left
  unfinished), so the reaper sees every request that could be stranded;
* a request is finished only by the claim that runs it (``claim`` token, checked by ``finish.lua``): a late
  writer whose batch was claimed again after its lock lapsed changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

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
    def capabilities(self) -> str:
        return f"{self.prefix}:capabilities"

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


def _lua(name: str) -> str:
    return files("shared").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


SUBMIT = _lua("submit")
SCHEDULE = _lua("schedule")
CLAIM = _lua("claim")
PROGRESS = _lua("progress")
FINISH = _lua("finish")
FAIL = _lua("fail")
ABORT = _lua("abort")
BATCH_DONE = _lua("batch_done")
REAP = _lua("reap")
STAMP_PUBLISHED = _lua("stamp_published")
HEARTBEAT = _lua("heartbeat")
FREE_SLOTS = _lua("free_slots")
RENEW = _lua("renew")
RELEASE = _lua("release")
