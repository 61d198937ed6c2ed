"""The scheduler's view of Redis: the request stream (consumer group), capacity, and the batch transition."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import redis

from scheduler.deadlines import NOT_STARTED, RAN_PAST, InFlightRequest
from shared import keys as k
from shared.celery_config import queues_in_fleet_redis
from shared.contracts import TIMEOUT_ERROR, RequestSpec, RequestStatus, StepEviction, WorkerCapabilities
from shared.fleet_state import parse_capabilities
from shared.settings import Settings
from shared.streams import by_stream

EVENTS_PAGE = 1000
QUEUE_ABORT = "queue_abort"  # the P:events type abort.lua adds with each id it puts in the aborted set
ABORTED_PAGE = 10_000  # aborted ids taken per SPOP (as many pages as there are, each round)
EXPIRE_PAGE = 500  # requests ended per EXPIRE script call


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One accepted request as read from the stream."""

    entry_id: str
    request_id: str
    spec: RequestSpec | None  # None when the entry is unreadable (then it is failed and discarded)
    requeued: bool = False  # put back by step-mode preemption (requeue.lua): it goes to the front of its level
    arrival: tuple[int, int] = (0, 0)  # its first entry id (ms, seq): this one's, or a requeued request's original
    owner: str = ""  # its API key's name ('' = none; submit.lua's field ``key``)
    share: float = 1.0  # its key's share (field ``share``): its weight in the fair order


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as the pair it is ordered by; (0, 0) when it is not one."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


@dataclass(frozen=True, slots=True)
class ReadResult:
    entries: list[StreamEntry]
    woken: bool  # an event (a finished batch, a new worker) arrived: capacity may have changed
    aborted: list[str] = field(default_factory=list)  # requests aborted while queued since the last read


@dataclass(frozen=True, slots=True)
class Reaped:
    """What one reaper pass found: batches to publish again, and how many finished batches it cleared."""

    republish: list[str]  # batch ids
    removed: int
    request_ids: dict[str, list[str]] = field(default_factory=dict)  # of each batch to publish again


@dataclass(frozen=True, slots=True)
class RunningSet:
    """A worker's step-mode running set as read from Redis (``P:step:sets``, ``P:step:rows``)."""

    worker: str
    digest: str  # its step key's digest (shared.compat.StepKey.digest), or k.STEP_SEALED
    rows: int  # requests in it or sent to it

    @property
    def sealed(self) -> bool:
        return self.digest == k.STEP_SEALED


@dataclass(frozen=True, slots=True)
class RunningMember:
    """A request running in a worker's step-mode set (``P:step:levels:{worker}``)."""

    request_id: str
    priority: int  # RequestSpec.priority
    joined_ms: float  # when it joined the set (the worker's wall clock, ms)


class Slots(NamedTuple):
    """``SchedulerStore.slots``: free worker slots (below 0 once batches wait for one) and the live workers that
    announced what they serve (``free_slots.lua``)."""

    free: int
    live: int


class Capacity(NamedTuple):
    """``SchedulerStore.capacity``: the free slots, what each live worker announces (by name) and each batch in
    flight that occupies a worker -> its model (None when unknown)."""

    slots: Slots
    workers: dict[str, WorkerCapabilities]
    busy: dict[str, str | None]


class LeaseLost(Exception):
    """The batch transition was refused: another scheduler holds the lease now."""


class SchedulerStore:
    """Redis operations of the active scheduler."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._redis = client
        self._settings = settings
        self.keys = k.RedisKeys(settings.key_prefix)
        self._schedule = client.register_script(k.SCHEDULE)
        self._reap = client.register_script(k.REAP)
        self._stamp_published = client.register_script(k.STAMP_PUBLISHED)
        self._fail = client.register_script(k.FAIL)
        self._free_slots = client.register_script(k.FREE_SLOTS)
        self._expire = client.register_script(k.EXPIRE)
        self._step_join = client.register_script(k.STEP_JOIN)
        self._step_evict = client.register_script(k.STEP_EVICT)
        self._step_swap = client.register_script(k.STEP_SWAP)
        self._aborted_due = True  # take the aborted set at the next read (see read_new)
        self._acks_due: list[str] = []  # request entries to acknowledge and delete with the next read (ack)
        self._events_due: list[str] = []  # wake-up events read, to acknowledge with the next read

    def ensure_groups(self) -> None:
        """Create the scheduler's consumer groups if missing (each lead starts here): its first read takes the
        aborted set whatever woke it."""
        self._aborted_due = True
        for stream in (self.keys.requests, self.keys.events):
            try:
                self._redis.xgroup_create(stream, k.SCHEDULER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read_new(self, block_ms: int, room: int | None = None) -> ReadResult:
        """At most ``room`` (and ``scheduler_read_count``) entries never read before, waiting up to ``block_ms`` for
        one (or for a worker event); then the requests aborted while queued since they were last taken
        (``take_aborted``): in the same round trip at a lead's first read, else after a read that brought a
        ``QUEUE_ABORT`` wake-up (abort.lua adds one with each id), so a round without aborts costs no SPOP. With
        ``room`` 0 (or less) only the wake-up events are read: new entries wait in the stream until the scheduler's
        queue has room again."""
        most = self._settings.scheduler_read_count
        limit = most if room is None else min(room, most)
        streams: dict[Any, Any] = (
            {self.keys.requests: ">", self.keys.events: ">"} if limit > 0 else {self.keys.events: ">"}
        )
        take = self._aborted_due
        pipe = self._redis.pipeline(transaction=False)
        sent = self._queue_acks(pipe)
        pipe.xreadgroup(
            k.SCHEDULER_GROUP, k.SCHEDULER_CONSUMER, streams, count=limit if limit > 0 else most, block=block_ms
        )
        if take:
            pipe.spop(self.keys.scheduler_aborted, ABORTED_PAGE)  # after the read: see take_aborted
        reply, *popped = pipe.execute()[sent:]
        self._acks_sent(sent)
        read = by_stream(reply)
        events = read.get(self.keys.events, [])
        kinds = [str((fields or {}).get("type", "")) for _, fields in events]
        if QUEUE_ABORT in kinds:
            self._aborted_due = True  # until taken: an outage in between must not strand them
        self._events_due += [entry_id for entry_id, _ in events]  # acknowledged with the next read
        entries = [self._entry(entry_id, fields) for entry_id, fields in read.get(self.keys.requests, [])]
        aborted = [str(rid) for rid in (popped[0] if take and popped[0] else [])]
        if len(aborted) == ABORTED_PAGE or (not take and self._aborted_due):
            aborted += self.take_aborted()
        self._aborted_due = False
        woken = any(kind != QUEUE_ABORT for kind in kinds)
        return ReadResult(entries=entries, woken=woken, aborted=aborted)

    def take_aborted(self) -> list[str]:
        """Take every id of ``P:scheduler:aborted``: requests aborted while queued (``abort.lua``), each with its
        stream entry deleted. Taken after a read, a request read before its abort is in the scheduler's queue when
        its id comes back (one aborted before the read had its entry deleted first: the read never returns it); ids
        of requests the scheduler does not hold (never read, or read by a leader before it) mean nothing."""
        taken: list[str] = []
        while page := cast(list[str], self._redis.spop(self.keys.scheduler_aborted, ABORTED_PAGE)):
            taken += page
            if len(page) < ABORTED_PAGE:
                break
        return taken

    def report_queued(self, count: int, ttl_ms: int) -> None:
        """Publish the in-memory queue length (``P:scheduler:queued``) for ``ttl_ms`` (the lease's time)."""
        self._redis.set(self.keys.scheduler_queued, count, px=ttl_ms)

    def read_pending(self, after: str = "0") -> list[StreamEntry]:
        """One page (``scheduler_read_count``) of entries read before but never acknowledged, after id ``after``.

        Queued entries stay pending until their request joins a batch, so a replay must page by the last id
        seen: reading from ``0`` again would return the same first page forever.
        """
        reply = self._redis.xreadgroup(
            k.SCHEDULER_GROUP,
            k.SCHEDULER_CONSUMER,
            {self.keys.requests: after},
            count=self._settings.scheduler_read_count,
        )
        return [self._entry(entry_id, fields) for entry_id, fields in by_stream(reply).get(self.keys.requests, [])]

    def drop_pending_events(self) -> None:
        """Acknowledge the wake-up events a previous leader read (they matter to no one now)."""
        while True:
            reply = self._redis.xreadgroup(
                k.SCHEDULER_GROUP, k.SCHEDULER_CONSUMER, {self.keys.events: "0"}, count=EVENTS_PAGE
            )
            ids = [entry_id for entry_id, _ in by_stream(reply).get(self.keys.events, [])]
            if not ids:
                return
            self._discard_events(ids)

    def _discard_events(self, entry_ids: list[str]) -> None:
        """Acknowledge wake-up events at once; the stream itself is bounded by its writers (every XADD to it trims
        it to about ``EVENTS_MAXLEN`` entries), so they are not deleted one by one."""
        if entry_ids:
            self._redis.xack(self.keys.events, k.SCHEDULER_GROUP, *entry_ids)

    def _queue_acks(self, pipe: Any) -> int:
        """Put the acknowledgements due (``ack``, the wake-ups ``read_new`` read) at the head of ``pipe``; how many
        commands that added (their replies come first)."""
        sent = 0
        if self._acks_due:
            pipe.xack(self.keys.requests, k.SCHEDULER_GROUP, *self._acks_due)
            pipe.xdel(self.keys.requests, *self._acks_due)
            sent += 2
        if self._events_due:
            pipe.xack(self.keys.events, k.SCHEDULER_GROUP, *self._events_due)
            sent += 1
        return sent

    def _acks_sent(self, sent: int) -> None:
        """The acknowledgements ``_queue_acks`` put in a pipeline were carried out (kept for the next until then:
        a failed round trip sends them again; acknowledging and deleting an entry twice does nothing)."""
        if sent:
            self._acks_due, self._events_due = [], []

    def flush_acks(self) -> None:
        """Send the acknowledgements due now (a lead's end), not with the next read."""
        pipe = self._redis.pipeline(transaction=False)
        sent = self._queue_acks(pipe)
        if sent:
            pipe.execute()
            self._acks_sent(sent)

    @staticmethod
    def _entry(entry_id: str, fields: dict[str, str] | None) -> StreamEntry:
        fields = fields or {}  # a deleted-but-pending entry reads back with no fields
        try:
            spec: RequestSpec | None = RequestSpec.model_validate_json(fields["spec"])
        except (KeyError, ValueError):
            spec = None
        requeued = fields.get("requeued") == "1"
        arrival = entry_order(fields.get("arrival") or entry_id)
        try:
            share = float(fields.get("share") or 1.0)
        except ValueError:
            share = 1.0
        if not 0 < share < float("inf"):
            share = 1.0
        owner = str(fields.get("key") or "")
        return StreamEntry(
            entry_id, fields.get("id", ""), spec, requeued=requeued, arrival=arrival, owner=owner, share=share
        )

    def statuses(self, request_ids: Sequence[str]) -> list[tuple[RequestStatus | None, bool, str | None]]:
        """(status, abort flag, batch id) of each request; status None when the request hash is gone."""
        pipe = self._redis.pipeline(transaction=False)
        for rid in request_ids:
            pipe.hmget(self.keys.request(rid), ["status", "abort", "batch_id"])
        out: list[tuple[RequestStatus | None, bool, str | None]] = []
        for status, abort, batch_id in pipe.execute():
            out.append((RequestStatus(status) if status else None, bool(abort), batch_id))
        return out

    def model_of(self, request_ids: Sequence[str]) -> str | None:
        """The model of a batch's requests (a batch holds one: it is in the batch keys), from the stored spec of the
        first of them still there (one round trip); None when none is."""
        pipe = self._redis.pipeline(transaction=False)
        for rid in request_ids:
            pipe.hget(self.keys.request(rid), "spec")
        for spec in pipe.execute():
            if spec:
                return RequestSpec.model_validate_json(spec).model
        return None

    def worker_models(self) -> dict[str, WorkerCapabilities]:
        """What each live worker (heartbeat newer than ``worker_ttl_s``, by Redis time) announces: the models it
        serves and which it holds resident, by worker name (two round trips: redis-py's cluster pipeline refuses
        ``TIME``, a command without a key)."""
        seconds, micros = self._redis.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrange(self.keys.workers, 0, -1, withscores=True)
        pipe.hgetall(self.keys.capabilities)
        workers, announced = pipe.execute()
        since_ms = int(seconds) * 1000 + int(micros) // 1000 - self._settings.worker_ttl_s * 1000
        out: dict[str, WorkerCapabilities] = {}
        for worker, beat_ms in workers:
            capabilities = parse_capabilities(announced.get(worker))
            if capabilities is not None and float(beat_ms) >= since_ms:
                out[str(worker)] = capabilities
        return out

    def in_flight_ids(self) -> set[str]:
        """The ids of the batches in flight (one round trip)."""
        return {str(batch_id) for batch_id in self._redis.zrange(self.keys.inflight, 0, -1)}

    def capacity(self, known: dict[str, str]) -> Capacity:
        """``slots``, ``worker_models`` and what occupies each worker (``Capacity.busy``, see ``_occupying``) in one
        round trip (plus one per batch in flight whose model is not known): the live workers are read after
        ``free_slots.lua`` swept the stale ones, in the same pipeline, so no Redis time is needed to tell them (and no
        ``TIME``, which a cluster pipeline refuses)."""
        try:
            (free, live), workers, announced, inflight, storing = self._capacity_reads()
        except redis.exceptions.NoScriptError:  # not loaded on this server (yet): load it, then read again
            self._redis.script_load(k.FREE_SLOTS)
            (free, live), workers, announced, inflight, storing = self._capacity_reads()
        out: dict[str, WorkerCapabilities] = {}
        for worker in workers:
            capabilities = parse_capabilities(announced.get(worker))
            if capabilities is not None:
                out[str(worker)] = capabilities
        busy = self._occupying(known, inflight, storing)
        return Capacity(Slots(int(free), int(live)), out, busy)

    def _capacity_reads(self) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        keys = self._free_slots_keys()
        # EVALSHA itself: a script registered with a plain pipeline costs it a SCRIPT EXISTS round trip first
        pipe.evalsha(self._free_slots.sha, len(keys), *keys, int(self._settings.worker_ttl_s * 1000))
        pipe.zrange(self.keys.workers, 0, -1)
        pipe.hgetall(self.keys.capabilities)
        pipe.zrange(self.keys.inflight, 0, -1)
        pipe.zrange(self.keys.storing, 0, -1)
        return list(pipe.execute())

    def _occupying(self, known: dict[str, str], inflight: list[str], storing: list[str]) -> dict[str, str | None]:
        """Each batch in flight that occupies a worker (not in the storing zset: its forward is running or it waits
        for one) -> its model, from ``known`` (batch id -> model: this call drops the batches no longer in flight
        and adds those it read) or else its requests' specs (``model_of``, for those batches only); None where no
        spec is left. ``inflight`` and ``storing``: the zsets as ``capacity`` read them; one round trip per batch
        not known."""
        for batch_id in set(known) - set(inflight):
            del known[batch_id]
        storing_ids = set(storing)
        occupying = [batch_id for batch_id in inflight if batch_id not in storing_ids]
        for batch_id in occupying:
            if batch_id not in known:
                model = self.model_of(str(self._redis.hget(self.keys.batch(batch_id), "ids") or "").split())
                if model is not None:
                    known[batch_id] = model
        return {str(batch_id): known.get(batch_id) for batch_id in occupying}

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Acknowledge and delete stream entries whose requests no longer need the scheduler: in the round trip of
        the next ``read_new`` (or ``flush_acks``), not one of their own. Until then they stay pending, as after a
        scheduler killed before its acknowledgement: a new leader's replay finds their requests past ``queued``
        (or gone) and acknowledges them (``SchedulerService._recover``); the queue-length check of ``submit.lua``
        counts them for the rest of the scheduler's round."""
        self._acks_due += entry_ids

    def free_slots(self) -> int:
        """``slots().free``."""
        return self.slots().free

    def slots(self) -> Slots:
        """Live worker slots (stale heartbeats swept first, by Redis time) minus batches in flight that occupy one,
        and the live workers, in one round trip.

        A batch leaves flight only when none of its requests is unfinished (``batch_done.lua``, ``reap.lua``),
        so a batch waiting to be published again still holds the slot it will take; a batch whose forward is over
        while its outputs are stored (``forward_done.lua``) frees its worker's slot for the next batch.
        """
        free, live = self._free_slots(keys=self._free_slots_keys(), args=[int(self._settings.worker_ttl_s * 1000)])
        return Slots(int(free), int(live))

    def _free_slots_keys(self) -> list[str]:
        keys = self.keys
        return [keys.workers, keys.inflight, keys.capabilities, keys.storing, keys.step_sets, keys.step_rows]

    def running_sets(self) -> list[RunningSet]:
        """Every worker's step-mode running set (one round trip), sealed ones included, by worker name. Sets of
        workers whose heartbeat is stale are swept by ``free_slots``; ``step_join`` checks liveness itself."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.step_sets)
        pipe.hgetall(self.keys.step_rows)
        sets, rows = cast(tuple[dict[str, str], dict[str, str]], tuple(pipe.execute()))
        return [RunningSet(worker, str(digest), int(rows.get(worker) or 0)) for worker, digest in sorted(sets.items())]

    def step_join(self, worker: str, digest: str, message_json: str, batch_id: str, count: int, cap: int) -> bool:
        """Send scheduled batch ``batch_id`` (its ``BatchMessage`` JSON, ``count`` requests) to ``worker``'s running
        set of step key ``digest`` (``step_join.lua``): False when refused (the worker is gone, its set closed,
        sealed, on another key, or it would hold more than ``cap`` requests); the caller publishes it instead."""
        keys, args = self._join_call(worker, digest, message_json, batch_id, count, cap)
        return int(self._step_join(keys=keys, args=args)) == 1

    def step_swap(
        self, worker: str, digest: str, message_json: str, batch_id: str, count: int, cap: int, evict: str
    ) -> int:
        """Send scheduled batch ``batch_id`` to ``worker``'s full running set of step key ``digest`` with, ahead of it,
        the eviction of ``evict`` whose room it takes (``step_swap.lua``): 2 when both were sent, 1 when ``evict``
        had left (or the set had room already) and the batch was sent as a plain join, 0 when refused (as
        ``step_join``; the caller publishes it instead)."""
        keys, args = self._join_call(worker, digest, message_json, batch_id, count, cap)
        eviction = StepEviction(evict=evict, joiner=batch_id).model_dump_json()
        return int(self._step_swap(keys=[*keys, self.keys.step_levels(worker)], args=[*args, evict, eviction]))

    def _join_call(
        self, worker: str, digest: str, message_json: str, batch_id: str, count: int, cap: int
    ) -> tuple[list[str], list[str | int]]:
        """The keys and arguments ``step_join.lua`` takes, which ``step_swap.lua`` begins with."""
        keys = [
            self.keys.step_sets,
            self.keys.step_rows,
            self.keys.step_inbox(worker),
            self.keys.workers,
            self.keys.storing,
        ]
        worker_ttl_ms = int(self._settings.worker_ttl_s * 1000)
        return keys, [worker, digest, message_json, batch_id, count, cap, worker_ttl_ms, self._inbox_ttl_ms]

    def step_levels(self, workers: Sequence[str]) -> dict[str, list[RunningMember]]:
        """The requests running in each worker's set with their priorities and join times
        (``P:step:levels:{worker}``, one round trip); a worker with none (or no set) maps to an empty list."""
        if not workers:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for worker in workers:
            pipe.hgetall(self.keys.step_levels(worker))
        out: dict[str, list[RunningMember]] = {}
        for worker, fields in zip(workers, pipe.execute(), strict=True):
            members: list[RunningMember] = []
            for request_id, value in cast(dict[str, str], fields).items():
                priority, _, joined = str(value).partition(" ")
                try:
                    members.append(RunningMember(str(request_id), int(priority), float(joined or 0)))
                except ValueError:
                    continue  # not written by a worker of this version: not a candidate
            out[worker] = members
        return out

    def step_evict(self, worker: str, digest: str, request_id: str) -> bool:
        """Ask ``worker``'s running set of step key ``digest`` to evict ``request_id`` at its next step boundary
        (``step_evict.lua``): False when the set is no longer open on that key or no longer runs the request."""
        keys = [self.keys.step_sets, self.keys.step_levels(worker), self.keys.step_inbox(worker)]
        message = StepEviction(evict=request_id).model_dump_json(exclude_none=True)  # as a worker before swaps reads it
        return int(self._step_evict(keys=keys, args=[worker, digest, request_id, message, self._inbox_ttl_ms])) == 1

    @property
    def _inbox_ttl_ms(self) -> int:
        """How long a worker's inbox outlives its last message: past any set's life (it is deleted with the set)."""
        return int(2 * self._settings.batch_time_limit_s * 1000)

    def schedule(
        self,
        lease_key: str,
        token: str,
        batch_id: str,
        request_ids: Sequence[str],
        deadlines: Sequence[float | None] = (),
    ) -> list[str]:
        """Atomically move the still-queued, non-aborted requests into batch ``batch_id``; returns those moved.
        ``deadlines[i]`` (None = none) is recorded with request i for the in-flight deadline sweep."""
        marks = ["" if deadline is None else repr(deadline) for deadline in deadlines]
        reply = self._schedule(
            keys=[
                lease_key,
                self.keys.batch(batch_id),
                self.keys.inflight,
                self.keys.metrics,
                *self.keys.request_strides(request_ids),
            ],
            args=[token, batch_id, time.time(), *request_ids, *marks],
        )
        if reply == -1:
            raise LeaseLost(batch_id)
        return cast(list[str], list(reply))

    def reap(self) -> Reaped:
        """One pass of the reaper over the batches in flight (see ``reap.lua``): it reads them, which of them no run
        holds and their requests first (a batch's ``ids`` are written once), then decides on those in one script. A
        held batch is left out (the script would pass it over); one whose lock lapses after the read is decided by
        the next pass."""
        batch_ids = cast(list[str], self._redis.zrange(self.keys.inflight, 0, -1))
        pipe = self._redis.pipeline(transaction=False)
        for batch_id in batch_ids:
            pipe.exists(self.keys.batch_lock(batch_id))
            pipe.hget(self.keys.batch(batch_id), "ids")
        read = pipe.execute() if batch_ids else []
        unheld = [(b, m) for b, held, m in zip(batch_ids, read[::2], read[1::2], strict=True) if not held]
        if not unheld:
            return Reaped(republish=[], removed=0, request_ids={})
        queues = queues_in_fleet_redis(self._settings, self.worker_models)  # live workers read only if several models
        keys = [self.keys.inflight, self.keys.storing, *queues]
        args: list[str | int] = [
            int(self._settings.batch_claim_timeout_s * 1000),
            self._settings.result_ttl_s,
            len(queues),
        ]
        for batch_id, members in unheld:
            request_ids = str(members or "").split()
            keys += [self.keys.batch(batch_id), self.keys.batch_lock(batch_id), *self.keys.request_strides(request_ids)]
            args += [batch_id, len(request_ids), *request_ids]
        pairs, removed = self._reap(keys=keys, args=args)
        ids = {str(pairs[i]): str(pairs[i + 1]).split() for i in range(0, len(pairs), 2)}
        return Reaped(republish=list(ids), removed=int(removed), request_ids=ids)

    def expire(self, request_ids: Sequence[str]) -> list[str]:
        """End requests past their deadline (``expire.lua``: queued or scheduled fail ``Timeout``, running ones are
        flagged aborted); each one's status after the call (``aborting`` when flagged now)."""
        ttl, channel = self._settings.result_ttl_s, self.keys.finished
        statuses: list[str] = []
        for start in range(0, len(request_ids), EXPIRE_PAGE):  # one short script per page, however many are due
            page = request_ids[start : start + EXPIRE_PAGE]
            args: list[str | float] = [time.time(), ttl, channel, TIMEOUT_ERROR, NOT_STARTED, RAN_PAST, *page]
            reply = self._expire(keys=[*self.keys.end_keys, *self.keys.request_strides(page)], args=args)
            statuses += [str(status) for status in reply]
        return statuses

    def in_flight(self) -> list[InFlightRequest]:
        """The requests of the batches in flight: status, recorded deadline and abort flag (three round trips,
        bounded by the batches in flight: at most one per worker slot, plus those waiting to be published again)."""
        batch_ids = cast(list[str], self._redis.zrange(self.keys.inflight, 0, -1))
        if not batch_ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for batch_id in batch_ids:
            pipe.hget(self.keys.batch(batch_id), "ids")
        request_ids = [rid for ids in pipe.execute() if ids for rid in str(ids).split()]
        pipe = self._redis.pipeline(transaction=False)
        for rid in request_ids:
            pipe.hmget(self.keys.request(rid), ["status", "deadline", "abort"])
        out: list[InFlightRequest] = []
        for rid, (status, deadline, abort) in zip(request_ids, pipe.execute(), strict=True):
            out.append(
                InFlightRequest(
                    id=rid,
                    status=RequestStatus(status) if status else None,
                    deadline=float(deadline) if deadline else None,
                    abort=bool(abort),
                )
            )
        return out

    def stamp_published(self, batch_id: str) -> list[str]:
        """Record that ``batch_id`` is published again now; its request ids (none when the batch is gone)."""
        return str(self._stamp_published(keys=[self.keys.batch(batch_id)])).split()

    def fail_unreadable(self, request_id: str, reason: str) -> None:
        """Fail a request whose stream entry cannot be read, so it does not stay queued forever."""
        if request_id:
            ttl, channel = self._settings.result_ttl_s, self.keys.finished
            args: list[str | float] = [time.time(), ttl, channel, "InvalidRequest", reason, request_id]
            self._fail(keys=[*self.keys.end_keys, *self.keys.request_keys(request_id)], args=args)
