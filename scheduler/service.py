"""The batching service: a thin loop around the pure policy (``scheduler.policy.decide``).

Each round: read new stream entries into the queue (``scheduler.queue``, in the order of ``scheduling_policy``;
blocking until the policy's next deadline, a request's deadline, a new request or a worker event; never more than
``max_queue_len`` held), drop the requests aborted while queued (``abort.lua`` names them in
``P:scheduler:aborted``: each leaves the queue and the pending list in O(1), whether or not a slot is free), fail
the queued requests past their deadline (``Timeout``), refresh the abort/status flags of the head of the queue, ask
the policy, and for each ``Dispatch`` move the requests into a batch atomically (fenced by the lease), publish the
Celery task, and only then acknowledge their stream entries. A window of the head that held aborted requests is
looked at again without them (never a blocking wait while live requests are behind them).

With ``step_mode`` (``docs/step_mode.md``) requests are bucketed by their step key (``shared.compat.step_key``), and
before a new batch is decided the head's batch may join a worker's open running set of its key with room
(``scheduler.policy.place``, over the sets read from Redis and cached like the free-slot count): the batch is
scheduled as any other and sent to the worker's inbox (``step_join.lua``); when the set closed, was sealed or filled
meanwhile, it is published to Celery as a normal batch instead (it starts a set on a free worker). With the
``priority`` scheduling policy, a head that can neither join a set nor start one (no free slot) may **preempt** a
request of a lower level running in a full set of its key (``scheduler.policy.preempt`` over the sets' members,
``P:step:levels:{worker}``, read only then): the worker evicts it at its next step boundary and requeues it
(``step_evict.lua``, ``requeue.lua``); its new stream entry puts it at the front of its level, and the freed room
goes to the head through ``place``. One eviction at a time per key: the next waits until the last is done.

Exactly one scheduler is active (a lease in Redis); others stand by and take over when it lapses. A new leader
first replays the pending (read, unacknowledged) entries page by page: queued requests wait again, requests that
already moved into a batch have that batch published again (workers skip finished or held batches), so a crash at
any point loses nothing and never runs a request in two batches.

The active scheduler also runs the reaper (``reap.lua``) about every second: a batch in flight that no run holds
and that still has unfinished requests is published again, at once when its last run ended without finishing it,
after ``batch_claim_timeout_s`` when its message was lost before any worker claimed it. With it runs the deadline
sweep (``scheduler.deadlines``): requests in flight past their deadline fail (scheduled) or are aborted (running).

A Redis outage never ends the process: the service backs off, stands by, and leads again (replaying from Redis,
the only state that counts) once Redis answers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache

from celery import Celery

from scheduler.deadlines import overdue
from scheduler.lease import LeaderLoop, Lease
from scheduler.policy import Dispatch, Join, Member, OpenSet, PolicyConfig, WaitingRequest, decide, place, preempt
from scheduler.queue import QUEUES, QueuedRequest
from scheduler.store import LeaseLost, RunningSet, SchedulerStore, StreamEntry
from shared.celery_config import RUN_BATCH_TASK
from shared.compat import StepKey, compat_key, pixel_cost, step_key
from shared.contracts import BatchMessage, RequestStatus
from shared.logging_setup import ids as ids_of
from shared.settings import Settings

log = logging.getLogger(__name__)

HEAD_WINDOW_MIN = 64  # the policy looks at most at this many (or 4 x max_num_seqs) requests from the head
REAP_INTERVAL_S = 1.0  # how often the active scheduler's reaper looks at the batches in flight
HEALTHY_LEAD_S = 10.0  # a lead that lasted this long before failing resets the backoff
CAPACITY_TTL_S = 0.25  # a known free-slot count is trusted this long unless a worker event says it changed


@lru_cache(maxsize=1024)
def _digest(key: StepKey) -> str:
    """``key.digest``, computed once per key (the step keys in use are few)."""
    return key.digest


class SchedulerService:
    """Leader election, stream reading and batch publishing around the policy."""

    def __init__(
        self,
        settings: Settings,
        store: SchedulerStore,
        lease: Lease,
        celery: Celery,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._store = store
        self._lease = lease
        self._celery = celery
        self._clock = clock  # the policy's: arrivals and admission waits
        self._leader = LeaderLoop(lease, self._lead, name="scheduler", clock=clock, healthy_lead_s=HEALTHY_LEAD_S)
        self._wall_clock = wall_clock  # the deadlines' (RequestSpec.deadline)
        self._config = PolicyConfig.from_settings(settings)
        self._window = max(HEAD_WINDOW_MIN, 4 * settings.max_num_seqs)
        self._queue = QUEUES[settings.scheduling_policy]()  # the requests read and not yet dispatched
        self._fresh: set[str] = set()  # admitted this round: certainly still queued unless aborted just now
        self._free: int | None = None  # free worker slots as last counted (minus our dispatches since)
        self._free_at = 0.0
        self._sets: list[RunningSet] | None = None  # step mode: running sets as last read (plus our joins since)
        self._sets_at = 0.0
        # step-mode preemption (priority levels only: under fcfs every request is level 0)
        self._preemption = settings.step_mode and settings.scheduling_policy == "priority"
        self._evicting: dict[str, str] = {}  # worker -> the request we asked its set to evict, until it is gone
        self._members_at: float | None = None  # when the sets' members were last read (None: read when needed)

    # --- leadership ------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Stand by until the lease is ours, lead until it is lost or ``stop`` is set; repeat. Never raises for a
        Redis outage (or an unexpected error): it backs off and tries again (``scheduler.lease.LeaderLoop``)."""
        self._leader.run(stop)

    def _lead(self, stop: threading.Event) -> None:
        self._queue.clear()
        self._fresh.clear()
        self._free = None
        self._sets = None
        self._evicting.clear()
        self._members_at = None
        self._store.ensure_groups()
        try:
            self._recover()
            self._store.report_queued(len(self._queue), self._lease.ttl_ms)
            renewal = self._leader.renewal()
            reaped_at = renewal.renewed_at
            deadline: float | None = None
            while not stop.is_set():
                now = self._clock()
                if now - reaped_at >= REAP_INTERVAL_S:
                    self._reap()
                    reaped_at = now
                if renewal.due(now):
                    if not renewal.renew(now):
                        return
                    self._store.report_queued(len(self._queue), self._lease.ttl_ms)
                block_s = renewal.until_due_s(now)
                if deadline is not None:
                    block_s = min(block_s, deadline - now)
                block_ms = max(1, min(self._settings.scheduler_block_ms, int(block_s * 1000) + 1))
                self._fresh.clear()
                read = self._store.read_new(block_ms, room=self._settings.max_queue_len - len(self._queue))
                if read.woken:
                    self._free = None  # a batch finished, a set closed or a worker joined
                    self._sets = None
                    self._members_at = None
                self._admit(read.entries)
                self._forget(read.aborted)  # after admitting: an id read in this round is dropped too
                deadline = self._dispatch_ready()
        except LeaseLost:
            log.warning("scheduler lease taken over; standing by")

    # --- reading ---------------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Replay, page by page, the entries a previous leader read but did not acknowledge."""
        self._store.drop_pending_events()
        after = "0"
        while entries := self._store.read_pending(after):
            self._admit(entries, recovering=True)
            after = entries[-1].entry_id
            if not self._lease.renew():  # a long replay must not let the lease lapse under it
                raise LeaseLost("lease lapsed during recovery")
        if self._queue:
            log.info("recovered %d queued requests", len(self._queue))

    def _admit(self, entries: list[StreamEntry], *, recovering: bool = False) -> None:
        if not entries:
            return
        now = self._clock()
        done: list[str] = []
        readable = []
        for entry in entries:
            if entry.spec is None:
                self._store.fail_unreadable(entry.request_id, "the queued request could not be read")
                done.append(entry.entry_id)
            else:
                readable.append(entry)
        if recovering:
            readable = self._recover_scheduled(readable, done)
        for entry in readable:
            assert entry.spec is not None
            spec = entry.spec
            self._queue.add(
                QueuedRequest(
                    id=entry.request_id,
                    entry_id=entry.entry_id,
                    key=step_key(spec) if self._settings.step_mode else compat_key(spec),
                    arrived_at=now,
                    cost=pixel_cost(spec),
                    priority=spec.priority,
                    deadline=spec.deadline,
                    arrival=entry.arrival,
                ),
                front=entry.requeued,
            )
            self._fresh.add(entry.request_id)
        self._store.ack(done)

    def _recover_scheduled(self, entries: list[StreamEntry], done: list[str]) -> list[StreamEntry]:
        """Keep queued entries; republish the batches of those already scheduled; drop the rest."""
        statuses = self._store.statuses([e.request_id for e in entries])
        keep: list[StreamEntry] = []
        republish: set[str] = set()
        for entry, (status, _, batch_id) in zip(entries, statuses, strict=True):
            if status is RequestStatus.QUEUED:
                keep.append(entry)
                continue
            if status is RequestStatus.SCHEDULED and batch_id:
                republish.add(batch_id)
            done.append(entry.entry_id)
        for batch_id in sorted(republish):
            self._republish(batch_id, "recorded by the previous scheduler")
        return keep

    def _reap(self) -> None:
        """Publish again every batch in flight that no run holds and that still has unfinished requests; end the
        requests in flight that are past their deadline."""
        reaped = self._store.reap()
        if reaped.removed:
            self._free = None
        for batch_id, ids in reaped.request_ids.items():
            self._publish_again(batch_id, ids, "its last run ended without finishing it, or its message was lost")
        late = overdue(self._store.in_flight(), self._wall_clock())
        if late:
            statuses = self._store.expire(late)
            log.info("%d requests in flight past their deadline: %s", len(late), sorted(set(statuses)))

    def _republish(self, batch_id: str, why: str) -> None:
        """Publish a recorded batch again (workers run only what is not finished, one run at a time)."""
        self._publish_again(batch_id, self._store.stamp_published(batch_id), why)

    def _publish_again(self, batch_id: str, ids: list[str], why: str) -> None:
        if ids:
            fields = ids_of(batch_id=batch_id, request_ids=ids)
            log.warning("publishing batch %s (%d requests) again: %s", batch_id, len(ids), why, extra=fields)
            self._publish(batch_id, ids)

    # --- dispatching -----------------------------------------------------------------------------------------
    def _dispatch_ready(self) -> float | None:
        """Fail what is past its deadline, publish every batch the policy allows now; return when to look again
        (None = on new input)."""
        self._expire_queued()
        until: float | None = None
        while self._queue:
            free = self._free_slots()
            sets = self._open_sets()
            head = self._head_window(check=free > 0 or bool(sets))
            if sets and (join := place(head, self._placeable(sets, head), self._config)) is not None:
                self._forget(join.dropped_ids)
                self._join(join, head)
                continue
            decision = decide(head, free, self._clock(), self._config)
            self._forget(decision.dropped_ids)
            if not isinstance(decision, Dispatch):
                if decision.dropped_ids:  # aborted requests left the window: look at the requests behind them
                    continue
                until = decision.until
                if free <= 0 and sets:
                    self._preempt(head, sets, free)
                break
            self._dispatch(decision)
            self._free = free - 1
        next_deadline = self._queue.next_deadline()
        if next_deadline is not None:  # wake for it: on the policy's clock, from now
            due = self._clock() + max(0.0, next_deadline - self._wall_clock())
            until = due if until is None else min(until, due)
        return until

    def _expire_queued(self) -> None:
        """Fail the waiting requests past their deadline (``Timeout``), then acknowledge their entries."""
        expired = self._queue.pop_expired(self._wall_clock())
        if expired:
            statuses = self._store.expire([r.id for r in expired])
            log.info("%d queued requests past their deadline: %s", len(expired), sorted(set(statuses)))
            self._store.ack([r.entry_id for r in expired])

    def _free_slots(self) -> int:
        """Free worker slots: counted in Redis when unknown, stale, or exhausted; else the running estimate."""
        now = self._clock()
        if self._free is None or self._free <= 0 or now - self._free_at > CAPACITY_TTL_S:
            self._free, self._free_at = self._store.free_slots(), now
        return self._free

    def _open_sets(self) -> list[RunningSet]:
        """Step mode: the running sets that take joins (not sealed), read from Redis when unknown or stale, else as
        last read plus our joins since. Empty in request-level mode."""
        if not self._settings.step_mode:
            return []
        now = self._clock()
        if self._sets is None or now - self._sets_at > CAPACITY_TTL_S:
            self._sets, self._sets_at = self._store.running_sets(), now
        return [s for s in self._sets if not s.sealed]

    @staticmethod
    def _placeable(sets: Sequence[RunningSet], head: Sequence[WaitingRequest]) -> list[OpenSet]:
        """``sets`` for the policy: each keyed by the step key of the waiting requests with its digest (a set no
        waiting request matches keeps its digest, which equals no step key)."""
        keys: dict[str, Hashable] = {}
        for request in head:
            if isinstance(request.key, StepKey):
                keys.setdefault(_digest(request.key), request.key)
        return [OpenSet(s.worker, keys.get(s.digest, s.digest), s.rows, s.sealed) for s in sets]

    def _preempt(self, head: list[WaitingRequest], sets: Sequence[RunningSet], free: int) -> None:
        """Step mode, priority levels: when the head can neither join a set nor start one, ask a set of its key to
        evict a request of a lower level (``scheduler.policy.preempt``). The sets' members are read (one round trip)
        at most once per ``CAPACITY_TTL_S`` unless an event woke the loop."""
        first = next((r for r in head if not r.aborted), None)
        if not self._preemption or first is None or not isinstance(first.key, StepKey):
            return
        now = self._clock()
        if self._members_at is not None and now - self._members_at < CAPACITY_TTL_S:
            return
        placeable = self._placeable(sets, head)
        open_workers = {s.worker for s in placeable}  # a set closed or sealed since: its eviction is moot
        self._evicting = {w: rid for w, rid in self._evicting.items() if w in open_workers}
        workers = [s.worker for s in placeable if s.key == first.key and not s.sealed]
        if not workers:
            return
        self._members_at = now
        members = self._store.step_levels(workers)
        for worker in workers:  # an eviction is done once its request left the set's levels (requeued or ended)
            if worker in self._evicting and self._evicting[worker] not in {m.request_id for m in members[worker]}:
                del self._evicting[worker]
        candidates = [
            OpenSet(
                s.worker,
                s.key,
                s.rows,
                s.sealed,
                members=tuple(Member(m.request_id, m.priority, m.joined_ms) for m in members.get(s.worker, [])),
                evicting=s.worker in self._evicting,
            )
            for s in placeable
            if s.worker in members
        ]
        decision = preempt(head, candidates, free, self._config)
        if decision is None:
            return
        fields = ids_of(worker=decision.worker, request_id=decision.request_id)
        if self._store.step_evict(decision.worker, _digest(first.key), decision.request_id):
            self._evicting[decision.worker] = decision.request_id
            log.info(
                "request %s (level %d) preempts %s in %s's running set",
                first.id,
                first.level,
                decision.request_id,
                decision.worker,
                extra=fields,
            )
        else:
            self._members_at = None  # the set closed, was sealed or the request ended: look again
            self._sets = None

    def _head_window(self, check: bool) -> list[WaitingRequest]:
        window = self._queue.head(self._window)
        ids = [request.id for request in window]
        # Requests that waited since an earlier round may have been aborted meanwhile: look (one round trip) when
        # something could be dispatched (``check``), once per round. SCHEDULE re-checks every request anyway.
        stale = [rid for rid in ids if rid not in self._fresh] if check else []
        aborted: set[str] = set()
        if stale:
            for rid, (status, abort, _) in zip(stale, self._store.statuses(stale), strict=True):
                if abort or status is not RequestStatus.QUEUED:
                    aborted.add(rid)
            self._fresh.update(stale)  # known this round: the next batch of the round need not look again
        return [
            WaitingRequest(r.id, r.key, r.arrived_at, aborted=r.id in aborted, cost=r.cost, level=self._queue.level(r))
            for r in window
        ]

    def _dispatch(self, decision: Dispatch) -> None:
        batch_id = uuid.uuid4().hex
        ids = list(decision.request_ids)
        deadlines = [request.deadline if (request := self._queue.get(rid)) else None for rid in ids]
        joined = self._store.schedule(self._lease.key, self._lease.token, batch_id, ids, deadlines)
        if joined:
            self._publish(batch_id, joined)
        self._forget(ids)

    def _join(self, join: Join, head: Sequence[WaitingRequest]) -> None:
        """Schedule ``join``'s requests into a batch and send it to the worker's running set; publish it to Celery
        instead when the set refuses it (closed, sealed or full meanwhile)."""
        batch_id = uuid.uuid4().hex
        ids = list(join.request_ids)
        first = next(r for r in head if r.id == ids[0])
        assert isinstance(first.key, StepKey)
        deadlines = [request.deadline if (request := self._queue.get(rid)) else None for rid in ids]
        joined = self._store.schedule(self._lease.key, self._lease.token, batch_id, ids, deadlines)
        if joined:
            message = self._message(batch_id, joined)
            cap = self._config.cap(first)
            fields = ids_of(batch_id=batch_id, worker=join.worker, request_ids=joined)
            if self._store.step_join(
                join.worker, _digest(first.key), message.model_dump_json(), batch_id, len(joined), cap
            ):
                log.info(
                    "joined batch %s (%d requests) to %s's running set",
                    batch_id,
                    len(joined),
                    join.worker,
                    extra=fields,
                )
                self._count_join(join.worker, len(joined))
            else:
                log.info("%s's running set refused batch %s; publishing it", join.worker, batch_id, extra=fields)
                self._sets = None  # it closed, was sealed or filled: read the sets again
                self._free = None  # the batch takes a slot of its own now
                self._publish(batch_id, joined)
        self._forget(ids)

    def _count_join(self, worker: str, count: int) -> None:
        """Count ``count`` requests just sent to ``worker``'s set against its room in the cached sets."""
        if self._sets is not None:
            self._sets = [
                RunningSet(s.worker, s.digest, s.rows + count) if s.worker == worker else s for s in self._sets
            ]

    @staticmethod
    def _message(batch_id: str, request_ids: list[str]) -> BatchMessage:
        return BatchMessage(batch_id=batch_id, request_ids=tuple(request_ids), created_at=time.time())

    def _publish(self, batch_id: str, request_ids: list[str]) -> None:
        message = self._message(batch_id, request_ids)
        self._celery.send_task(
            RUN_BATCH_TASK,
            args=[message.model_dump(mode="json")],
            task_id=batch_id,
            queue=self._settings.queue_name,
        )
        fields = ids_of(batch_id=batch_id, request_ids=request_ids)
        log.info("published batch %s with %d requests", batch_id, len(request_ids), extra=fields)

    def _forget(self, request_ids: tuple[str, ...] | list[str]) -> None:
        """Drop requests from the queue and acknowledge their entries (after any publish)."""
        entries = [request.entry_id for rid in request_ids if (request := self._queue.remove(rid))]
        self._store.ack(entries)
