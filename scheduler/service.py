"""The batching service: a thin loop around the pure policy (``scheduler.policy.decide``).

Contract: ``SchedulerService.run(stop)`` leads while it holds the lease (standing by otherwise) until ``stop`` is
set, and never ends on a Redis outage (it backs off, stands by and leads again). While it leads, a request read
from the stream is acknowledged only once its batch is scheduled (``SCHEDULE``, fenced by the lease) and
published; a new leader replays the pending entries first, so a crash at any point loses nothing and never runs a
request in two batches. It also runs the reaper and the deadline sweep (``scheduler.deadlines``). This is the
request-level service; ``scheduler.step_service`` subclasses it for step mode (``service_for`` chooses). The round,
step by step: docs/architecture.md#the-schedulers-round-and-queue; the guarantees:
docs/architecture.md#delivery-guarantees.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence

import redis
from celery import Celery

from scheduler.capacity import ModelSlots, decide_by_model, prefetch_decide, prefetch_room
from scheduler.deadlines import overdue
from scheduler.knees import KNEES_TTL_S, KneeCaps
from scheduler.lease import LeaderLoop, Lease
from scheduler.policy import Dispatch, PolicyConfig, WaitingRequest, decide
from scheduler.queue import QueuedRequest, queue_of
from scheduler.store import LeaseLost, RunningSet, SchedulerStore, StreamEntry
from shared.celery_config import RUN_BATCH_TASK, publish_options
from shared.compat import compat_key, key_model, pixel_cost
from shared.contracts import BatchMessage, RequestSpec, RequestStatus
from shared.logging_setup import ids as ids_of
from shared.routing import model_queue, worker_queue
from shared.settings import Settings

log = logging.getLogger(__name__)

HEAD_WINDOW_MIN = 64  # the policy looks at most at this many (or 4 x max_num_seqs) requests from the head
REAP_INTERVAL_S = 1.0  # how often the active scheduler's reaper looks at the batches in flight
HEALTHY_LEAD_S = 10.0  # a lead that lasted this long before failing resets the backoff
CAPACITY_TTL_S = 0.25  # a known free-slot count is trusted this long unless a worker event says it changed


class SchedulerService:
    """Leader election, stream reading and batch publishing around the policy (request-level; step mode's
    subclass is ``scheduler.step_service.StepSchedulerService``; ``service_for(settings)`` picks)."""

    serves_step_mode = False  # StepSchedulerService's True: a service refuses settings of the other mode

    def __init__(
        self,
        settings: Settings,
        store: SchedulerStore,
        lease: Lease,
        celery: Celery,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        *,
        wanted: Callable[[], bool] | None = None,
        name: str = "scheduler",
    ) -> None:
        """``wanted``: whether this process is to lead now (a sharded fleet's spread, ``scheduler.shard_leaders``;
        None: always contend); ``name`` names the leader in the log lines (with its shard)."""
        if settings.step_mode != self.serves_step_mode:
            raise ValueError(
                f"{type(self).__name__} does not serve step_mode={settings.step_mode}: build service_for(settings)"
            )
        self._settings = settings
        self._store = store
        self._lease = lease
        self._celery = celery
        self._clock = clock  # the policy's: arrivals and admission waits
        self._leader = LeaderLoop(
            lease, self._lead, name=name, clock=clock, healthy_lead_s=HEALTHY_LEAD_S, wanted=wanted
        )
        self._wall_clock = wall_clock  # the deadlines' (RequestSpec.deadline)
        self._config = PolicyConfig.from_settings(settings)
        self._window = max(HEAD_WINDOW_MIN, 4 * self._config.widest)
        self._queue = queue_of(settings)  # the requests read and not yet dispatched
        self._fresh: set[str] = set()  # queued and unaborted as far as we know: see _head_window
        self._slots: ModelSlots | None = None  # what occupies each worker (None: a fleet of one model, not counted)
        self._batch_models: dict[str, str] = {}  # batch id -> its model, for the batches in flight
        self._placed: dict[str, str] = {}  # batch id -> the worker it was placed on (its own queue), in flight
        self._free: int | None = None  # free worker slots as last counted (minus our dispatches since)
        self._free_at = 0.0
        self._live: int | None = None  # live workers, counted with the free slots (``SchedulerStore.slots``)
        # prefetch (scheduler.capacity): a fleet of one model, request-level mode, an order other than fair
        self._prefetches = not (
            self.serves_step_mode or len(settings.catalog) > 1 or settings.scheduling_policy == "fair"
        )
        self._knees = KneeCaps()  # the batch caps the workers announce (scheduler.knees)
        self._knees_at = -KNEES_TTL_S

    # --- leadership ------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Stand by until the lease is ours, lead until it is lost or ``stop`` is set; repeat. Never raises for a
        Redis outage (or an unexpected error): it backs off and tries again (``scheduler.lease.LeaderLoop``)."""
        self._leader.run(stop)

    def _lead(self, stop: threading.Event) -> None:
        self._new_lead()
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
                        break
                    self._store.report_queued(len(self._queue), self._lease.ttl_ms)
                block_s = renewal.until_due_s(now)
                if deadline is not None:
                    block_s = min(block_s, deadline - now)
                block_ms = max(1, min(self._settings.scheduler_block_ms, int(block_s * 1000) + 1))
                read = self._store.read_new(block_ms, room=self._settings.max_queue_len - len(self._queue))
                if read.woken:
                    self._forget_capacity()  # a batch finished, a set closed or a worker joined
                if len(read.aborted) >= self._settings.max_queue_len:
                    self._fresh.clear()  # abort.lua drops ids while the set is this full: look at every request
                self._admit(read.entries)
                self._forget(read.aborted)  # after admitting: an id read in this round is dropped too
                deadline = self._dispatch_ready()
        except LeaseLost:
            log.warning("scheduler lease taken over; standing by")
        # a lead that ends (stopped, lease lost) sends the acknowledgements due, best effort: else the next leader's
        # replay acknowledges them. One that ends by an outage keeps them for its next lead's first read.
        with contextlib.suppress(redis.RedisError, OSError):
            self._store.flush_acks()

    # --- hooks (``scheduler.step_service`` overrides them) -------------------------------------------------------
    def _key(self, spec: RequestSpec) -> Hashable:
        """What a batch's requests share: the compatibility key."""
        return compat_key(spec)

    def _new_lead(self) -> None:
        """Forget what an earlier lead held: Redis is the only state that counts."""
        self._queue.clear()
        self._fresh.clear()
        self._forget_capacity()

    def _forget_capacity(self) -> None:
        """Count the free slots again when next asked (a worker event said they changed)."""
        self._free = None

    def _room(self) -> Sequence[RunningSet]:
        """Where a batch may go besides a free slot: none here."""
        return ()

    def _join_head(self, head: list[WaitingRequest], room: Sequence[RunningSet]) -> bool:
        """Send the head's batch into ``room``; whether it went (then the loop looks at the queue again)."""
        return False

    def _when_full(self, head: list[WaitingRequest], room: Sequence[RunningSet], free: int) -> float | None:
        """No batch was dispatched and no slot is free (``free`` <= 0) while ``room`` exists; when to look again
        (clock value; None = on new input)."""
        return None

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
                    key=self._key(spec),
                    arrived_at=now,
                    cost=pixel_cost(spec),
                    priority=spec.priority,
                    deadline=spec.deadline,
                    arrival=entry.arrival,
                    owner=entry.owner,
                    share=entry.share,
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
        if self._placed:
            self._place_again_from_gone_workers()
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
            if len(self._settings.catalog) > 1:  # placed again on what the workers hold now (handed back, lost)
                self._placed.pop(batch_id, None)  # where it went occupies that worker no more
                self._forget_capacity()
                self._free_slots()
            self._publish(batch_id, ids)

    # --- dispatching -----------------------------------------------------------------------------------------
    def _dispatch_ready(self) -> float | None:
        """Fail what is past its deadline, publish every batch the policy allows now; return when to look again
        (None = on new input)."""
        self._expire_queued()
        until: float | None = None
        while self._queue:
            free = self._free_slots()
            room = self._room()
            head = self._head_window(check=free > 0 or bool(room))
            if room and self._join_head(head, room):
                continue
            decision = (decide if self._slots is None else decide_by_model)(head, free, self._clock(), self._config)
            self._forget(decision.dropped_ids)
            if not isinstance(decision, Dispatch):
                if decision.dropped_ids:  # aborted requests left the window: look at the requests behind them
                    continue
                until = decision.until
                if free <= 0 and room and (again := self._when_full(head, room, free)) is not None:
                    until = again if until is None else min(until, again)
                if self._prefetch(free):
                    continue
                break
            if self._dispatch(decision):
                self._free = free - 1
        next_deadline = self._queue.next_deadline()
        if next_deadline is not None:  # wake for it: on the policy's clock, from now
            due = self._clock() + max(0.0, next_deadline - self._wall_clock())
            until = due if until is None else min(until, due)
        return until

    def _expire_queued(self) -> None:
        """Fail the waiting requests past their deadline (``Timeout``), then acknowledge their entries."""
        expired = self._queue.pop_expired(self._wall_clock())
        self._fresh.difference_update(r.id for r in expired)
        if expired:
            statuses = self._store.expire([r.id for r in expired])
            log.info("%d queued requests past their deadline: %s", len(expired), sorted(set(statuses)))
            self._store.ack([r.entry_id for r in expired])

    def _free_slots(self) -> int:
        """Free worker slots: counted in Redis when unknown (a worker event said they changed: ``_forget_capacity``)
        or stale (counted ``CAPACITY_TTL_S`` ago); else the running estimate, our dispatches since taken off. An
        exhausted estimate is trusted as long: a slot frees with a worker event (``forward_done.lua``,
        ``batch_done.lua``, a set's close, a first heartbeat), which forgets it, so while every worker is busy each
        arrival costs no count."""
        now = self._clock()
        if self._free is None or now - self._free_at > CAPACITY_TTL_S:
            if len(self._settings.catalog) > 1:  # with the count: what occupies each worker (scheduler.capacity)
                capacity = self._store.capacity(self._batch_models)
                slots = capacity.slots
                for batch_id in set(self._placed) - set(self._batch_models):  # out of flight
                    del self._placed[batch_id]
                self._slots = ModelSlots.count(capacity.workers, capacity.busy, self._placed)
            else:
                slots = self._store.slots()
            self._free, self._live, self._free_at = slots.free, slots.live, now  # together, once counted
        return self._free

    def _prefetch(self, free: int) -> bool:
        """No worker is free (``free`` <= 0): publish the next batch that can grow no more, for the first worker to
        free (``scheduler.capacity``: a fleet of one model, request-level mode, an order other than fair, one waiting
        per live worker, full or closed batches only). Whether the queue changed (a batch went, or aborted requests
        left it): look again."""
        if not self._prefetches or free > 0:
            return False  # free > 0: the policy's own turn
        if self._live is None or prefetch_room(free, self._live) <= 0:  # _live: counted with the free slots
            return False
        decision = prefetch_decide(self._head_window(check=True), self._clock(), self._config)
        self._forget(decision.dropped_ids)
        if not isinstance(decision, Dispatch):
            return bool(decision.dropped_ids)
        if self._dispatch(decision):
            self._free = free - 1
        return True

    def _backlog(self, model: str, leaving: int | None = None) -> int:
        """The batches, of its cap, that the waiting requests of ``model`` make besides the ``leaving`` of them
        (None: its next batch's, up to its cap)."""
        cap = self._config.by_model.get(model, self._config).max_num_seqs
        waiting = self._queue.waiting_of(model)
        return -(-max(0, waiting - (min(cap, waiting) if leaving is None else leaving)) // cap)

    def _servable_head(self) -> list[QueuedRequest]:
        """The first ``_window`` waiting requests, in service order, of models with a worker to take their next batch
        now (a fleet of several models: the others wait aside, so they neither block the head of their level nor
        publish batches that wait for a busy worker, or for none, while another worker is idle)."""
        assert self._slots is not None
        rooms: dict[str | None, bool] = {}

        def servable(request: QueuedRequest) -> bool:
            model = key_model(request.key)
            if model not in rooms:
                assert self._slots is not None
                rooms[model] = model is not None and self._slots.has_room(model, self._backlog(model))
            return rooms[model]

        looked = self._window
        while True:
            head = self._queue.head(looked)
            window = [request for request in head if servable(request)]
            if len(window) >= self._window or len(head) < looked:
                return window[: self._window]
            looked *= 4

    def _head_window(self, check: bool) -> list[WaitingRequest]:
        window = self._servable_head() if self._slots is not None else self._queue.head(self._window)
        ids = [request.id for request in window]
        # A request aborted while queued comes back through the aborted set (``take_aborted``, every round), which
        # abort.lua fills only while it holds fewer than max_queue_len ids: so a request admitted (or looked at)
        # since the set last was that full (``_fresh``) is queued and unaborted unless its id is on its way. The
        # others may have been aborted unseen: look (one round trip) when something could be dispatched
        # (``check``). SCHEDULE re-checks every request anyway.
        stale = [rid for rid in ids if rid not in self._fresh] if check else []
        aborted: set[str] = set()
        if stale:
            for rid, (status, abort, _) in zip(stale, self._store.statuses(stale), strict=True):
                if abort or status is not RequestStatus.QUEUED:
                    aborted.add(rid)
            self._fresh.update(stale)  # known now: the aborted set brings what changes
        if window and self._clock() - self._knees_at >= KNEES_TTL_S:
            self._knees, self._knees_at = KneeCaps.of(self._store.worker_models()), self._clock()
        return [
            WaitingRequest(
                r.id,
                r.key,
                r.arrived_at,
                aborted=r.id in aborted,
                cost=r.cost,
                level=self._queue.level(r),
                knee=self._knees.knee(r.key, r.cost),
            )
            for r in window
        ]

    def _dispatch(self, decision: Dispatch) -> bool:
        """Schedule and publish the decision's batch; whether a batch was published (it took a slot)."""
        batch_id, joined = self._schedule(decision.request_ids)
        if joined:
            model = self._model_of(decision.request_ids)
            worker = self._publish(batch_id, joined, model)
            if self._slots is not None:
                self._slots.take(model, worker)
        if len(joined) < len(decision.request_ids):  # some had ended unseen (not by the aborted set): look again
            self._fresh.clear()
        self._forget(decision.request_ids)
        return bool(joined)

    def _model_of(self, request_ids: Sequence[str]) -> str | None:
        """The model of these waiting requests (one batch holds one: it is in both batch keys); None when unknown."""
        request = self._queue.get(request_ids[0])
        return key_model(request.key) if request is not None else None

    def _schedule(self, request_ids: Sequence[str]) -> tuple[str, list[str]]:
        """Move these requests into a new batch (``SCHEDULE``, fenced by the lease): its id, and the requests it
        took (those still queued and not aborted). Their entries are acknowledged by ``_forget`` after a publish."""
        batch_id = uuid.uuid4().hex
        ids = list(request_ids)
        deadlines = [request.deadline if (request := self._queue.get(rid)) else None for rid in ids]
        return batch_id, self._store.schedule(self._lease.key, self._lease.token, batch_id, ids, deadlines)

    @staticmethod
    def _message(batch_id: str, request_ids: list[str], model: str | None = None) -> BatchMessage:
        return BatchMessage(batch_id=batch_id, request_ids=tuple(request_ids), created_at=time.time(), model=model)

    def _publish(self, batch_id: str, request_ids: list[str], model: str | None = None) -> str | None:
        """Publish the batch (``model`` None: read from its requests, a batch published again): in a fleet of several
        models on the own queue of the worker placement names, else (one model, or none named) on its model's queue
        (``shared.routing``), which only workers that serve the model consume. Returns that worker (None: the
        model's queue)."""
        several = len(self._settings.catalog) > 1  # one model: every batch is its, nothing to read
        model = model or (self._store.model_of(request_ids) if several else None) or self._settings.model_id
        if several:  # for the model's room (the capacity count forgets it once out of flight)
            self._batch_models[batch_id] = model
        message = self._message(batch_id, request_ids, model)
        worker = self._place(batch_id, request_ids, model) if several else None
        self._celery.send_task(
            RUN_BATCH_TASK,
            args=[message.model_dump(mode="json")],
            task_id=batch_id,
            queue=model_queue(self._settings, model) if worker is None else worker_queue(self._settings, worker),
            **publish_options(self._settings),
        )
        fields = ids_of(batch_id=batch_id, request_ids=request_ids)
        where = f" on {worker}" if worker is not None else ""
        log.info("published batch %s with %d requests%s", batch_id, len(request_ids), where, extra=fields)
        return worker

    def _place_again_from_gone_workers(self) -> None:
        """Publish again, placed anew, the batches in flight placed on a worker that is no longer live: its own queue
        has no other consumer, so they would wait for the reaper's claim timeout. One it claimed before it went is
        harmless to publish (the claim lock admits one run; the reaper re-runs it once its lock lapses)."""
        live, in_flight = self._store.worker_models(), self._store.in_flight_ids()
        for batch_id in set(self._placed) - in_flight:
            del self._placed[batch_id]
        gone = {batch_id: worker for batch_id, worker in self._placed.items() if worker not in live}
        for batch_id, worker in gone.items():
            del self._placed[batch_id]
            self._republish(batch_id, f"it was placed on {worker}, which is gone")

    def _place(self, batch_id: str, request_ids: Sequence[str], model: str) -> str | None:
        """The worker to place the batch on, or None for the model's queue (``scheduler.placement``: a free resident
        worker, else a cold load only when it wins, the model's backlog counted; None only for a batch published
        again while no worker is free for it), from the counts last made."""
        # the backlog behind this batch (its own requests leave the queue after the publish)
        backlog = self._backlog(model, sum(rid in self._queue for rid in request_ids))
        worker = self._slots.target(model, backlog) if self._slots is not None else None
        self._placed.pop(batch_id, None)
        if worker is not None:
            self._placed[batch_id] = worker
        return worker

    def _forget(self, request_ids: Sequence[str]) -> None:
        """Drop requests from the queue and acknowledge their entries (after any publish)."""
        entries = [request.entry_id for rid in request_ids if (request := self._queue.remove(rid))]
        self._fresh.difference_update(request_ids)
        self._store.ack(entries)
