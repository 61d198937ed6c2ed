"""The batching service in step mode (``docs/step_mode.md``): ``SchedulerService`` with running sets to join.

Requests are bucketed by their step key (``shared.compat.step_key``: without task and strength for a task their
model's live workers announce its step rows carry, ``scheduler.row_tasks``), and before a new batch is decided the
head's batch may join a worker's open running set of its key with room (``scheduler.policy.place``, over the sets read
from Redis and cached like the free-slot count): the batch is scheduled as any other and sent to the worker's inbox
(``step_join.lua``); when the set closed, was sealed or filled meanwhile, it is published to Celery as a normal
batch instead (it starts a set on a free worker). With the ``priority`` scheduling policy, a head that can neither
join a set nor start one (no free slot) may **preempt** a request of a lower level running in a full set of its key
(``scheduler.policy.preempt`` over the sets' members, ``P:step:levels:{worker}``, read only then): the worker
evicts it at its next step boundary and requeues it (``step_evict.lua``, ``requeue.lua``); its new stream entry
puts it at the front of its level, and the freed room goes to the head through ``place``. One eviction at a time
per key: the next waits until the last is done. With the ``fair`` policy, a waiting request of the head's level
whose flow (model, API key) runs at least two fewer requests than another's may also **swap** into a full set of
its key (``scheduler.policy.swap``): its batch and the eviction of the other flow's request go to the worker's
inbox together (``step_swap.lua``), so that the eviction and its join are one step boundary; one eviction at a
time per set. The flows of the running requests are the ones this scheduler scheduled (``_flows``: a request it
did not schedule, such as one of an earlier leader's, is never swapped out).

Everything else (leadership, reading, the reaper, deadlines, dispatching to free slots) is the base class's;
``service_for(settings)`` is the one choice between the two.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from scheduler.knees import KNEES_TTL_S
from scheduler.policy import Member, OpenSet, WaitingRequest, place, preempt, swap
from scheduler.queue import QueuedRequest
from scheduler.row_tasks import RowTasks
from scheduler.service import CAPACITY_TTL_S, SchedulerService
from scheduler.store import RunningMember, RunningSet
from shared.compat import StepKey, key_model, step_key
from shared.contracts import RequestSpec
from shared.logging_setup import ids as ids_of
from shared.settings import Settings

log = logging.getLogger(__name__)

SWAP_RETRY_S = 0.05
"""While a swap waits for requests sent to a set to show among its members (a full set whose rows all left at once
has none to evict until its joiners join, at its next step boundary), the sets' members are read again this often."""
SENT_TTL_S = 5.0
"""How long a request sent to a set counts in its flow's running requests before it shows among the set's members
(it joins at the set's next step boundary: a request it never shows in, one that ended first, stops counting)."""
FLOW_MEMORY_S = 60.0
"""How long the flow of a request this scheduler scheduled is kept while no set's members show it (a batch may
wait that long to join or start); while they show it, it is kept."""


@lru_cache(maxsize=1024)
def _digest(key: StepKey) -> str:
    """``key.digest``, computed once per key (the step keys in use are few)."""
    return key.digest


def service_for(settings: Settings) -> type[SchedulerService]:
    """The service ``settings`` asks for: step mode's, or the request-level one."""
    return StepSchedulerService if settings.step_mode else SchedulerService


class StepSchedulerService(SchedulerService):
    """``SchedulerService`` whose batches may join running sets (see the module's docstring)."""

    serves_step_mode = True

    _sets: list[RunningSet] | None = None  # running sets as last read (plus our joins since)
    _sets_at = 0.0
    _members_at: float | None = None  # when the sets' members were last read (None: read when needed)
    _members_for: Hashable = None  # the head they were read for (another head reads them again)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._evicting: dict[str, str] = {}  # worker -> the request we asked its set to evict, until it is gone
        self._fair = self._settings.scheduling_policy == "fair"  # flows swap rows: their requests are remembered
        self._flows: dict[str, tuple[Hashable, float]] = {}  # request id -> its flow and when we scheduled it
        self._running: set[str] = set()  # the sets' members as last read (fair order)
        self._pruned_at = 0.0
        self._sent: dict[str, dict[str, float]] = {}  # worker -> what we sent its set and it does not show yet: when
        self._row_tasks = RowTasks()  # which tasks each model's step rows carry (read with the announcements)
        self._row_tasks_at: float | None = None

    # --- the hooks ----------------------------------------------------------------------------------------------
    def _new_lead(self) -> None:
        super()._new_lead()
        self._evicting.clear()
        self._flows.clear()
        self._sent.clear()

    def _schedule(self, request_ids: Sequence[str]) -> tuple[str, list[str]]:
        """The base class's, and each request's flow remembered (``swap`` weighs the sets' members by flow)."""
        if self._fair:
            now = self._clock()
            for rid in request_ids:
                request = self._queue.get(rid)
                if request is not None:
                    self._flows[rid] = (_flow(request), now)
            self._prune(now)
        return super()._schedule(request_ids)

    def _key(self, spec: RequestSpec) -> Hashable:
        now = self._clock()
        if self._row_tasks_at is None or now - self._row_tasks_at >= KNEES_TTL_S:
            self._row_tasks, self._row_tasks_at = RowTasks.of(self._store.worker_models()), now
        return step_key(spec, self._row_tasks.of_model(spec.model))

    def _forget_capacity(self) -> None:
        super()._forget_capacity()
        self._sets = None
        self._members_at = None

    def _room(self) -> list[RunningSet]:
        """The running sets that take joins (not sealed), read from Redis when unknown or stale, else as last read
        plus our joins since."""
        now = self._clock()
        if self._sets is None or now - self._sets_at > CAPACITY_TTL_S:
            self._sets, self._sets_at = self._store.running_sets(), now
        return [s for s in self._sets if not s.sealed]

    def _join_head(self, head: list[WaitingRequest], room: Sequence[RunningSet]) -> bool:
        join = place(head, self._placeable(room, head), self._config)
        if join is None:
            return False
        self._forget(join.dropped_ids)
        self._join(join.worker, join.request_ids, head)
        return True

    def _when_full(self, head: list[WaitingRequest], room: Sequence[RunningSet], free: int) -> float | None:
        return self._preempt(head, room, free)

    # --- joining ------------------------------------------------------------------------------------------------
    @staticmethod
    def _placeable(sets: Sequence[RunningSet], head: Sequence[WaitingRequest]) -> list[OpenSet]:
        """``sets`` for the policy: each keyed by the step key of the waiting requests with its digest (a set no
        waiting request matches keeps its digest, which equals no step key)."""
        keys: dict[str, Hashable] = {}
        for request in head:
            if isinstance(request.key, StepKey):
                keys.setdefault(_digest(request.key), request.key)
        return [OpenSet(s.worker, keys.get(s.digest, s.digest), s.rows, s.sealed) for s in sets]

    def _join(
        self, worker: str, request_ids: Sequence[str], head: Sequence[WaitingRequest], evict: str | None = None
    ) -> bool:
        """Schedule these requests into a batch and send it to ``worker``'s running set (``evict``: with the eviction
        of that request, whose room it takes, ``step_swap.lua``); publish it to Celery instead when the set refuses
        it (closed, sealed or full meanwhile). Whether the eviction was sent."""
        first = next(r for r in head if r.id == request_ids[0])
        assert isinstance(first.key, StepKey)
        batch_id, joined = self._schedule(request_ids)
        evicting = False
        if joined:
            message = self._message(batch_id, joined, first.key.model)
            cap = self._config.cap(first)
            fields = ids_of(batch_id=batch_id, worker=worker, request_ids=joined)
            digest, body = _digest(first.key), message.model_dump_json()
            if evict is None:
                sent = 1 if self._store.step_join(worker, digest, body, batch_id, len(joined), cap) else 0
            else:
                sent = self._store.step_swap(worker, digest, body, batch_id, len(joined), cap, evict)
            if sent and self._fair:
                self._sent.setdefault(worker, {}).update(dict.fromkeys(joined, self._clock()))
            if sent == 2:
                evicting = True
                log.info(
                    "request %s swaps into %s's running set for %s (fair order)",
                    joined[0],
                    worker,
                    evict,
                    extra=ids_of(batch_id=batch_id, worker=worker, request_id=joined[0]),
                )
            elif sent == 1:
                log.info(
                    "joined batch %s (%d requests) to %s's running set", batch_id, len(joined), worker, extra=fields
                )
                self._count_join(worker, len(joined))
            else:
                log.info("%s's running set refused batch %s; publishing it", worker, batch_id, extra=fields)
                self._sets = None  # it closed, was sealed or filled: read the sets again
                self._free = None  # the batch takes a slot of its own now
                self._publish(batch_id, joined, first.key.model)
        self._forget(request_ids)
        return evicting

    def _count_join(self, worker: str, count: int) -> None:
        """Count ``count`` requests just sent to ``worker``'s set against its room in the cached sets."""
        if self._sets is not None:
            self._sets = [
                RunningSet(s.worker, s.digest, s.rows + count) if s.worker == worker else s for s in self._sets
            ]

    # --- preemption ---------------------------------------------------------------------------------------------
    def _members_of(self, running: Sequence[RunningMember]) -> tuple[Member, ...]:
        """A set's running requests as the policy weighs them, each with the flow this scheduler knows it by."""
        return tuple(Member(m.request_id, m.priority, m.joined_ms, self._flow_of(m.request_id)) for m in running)

    def _preempt(self, head: list[WaitingRequest], sets: Sequence[RunningSet], free: int) -> float | None:
        """When the head can neither join a set nor start one: priority levels, ask a set of its key to evict a
        request of a lower level (``scheduler.policy.preempt``); else, in the fair order, swap waiting requests of
        its level into full sets in place of another flow's (``scheduler.policy.swap``, as many as it allows). The
        sets' members are read (one round trip) at most once per ``CAPACITY_TTL_S`` for one look (the head, and in
        the fair order the first waiting request of each flow) unless an event woke the loop; a new look (a
        higher level's or another flow's arrival) reads them at once: it would otherwise wait for the next worker
        event, as nothing else wakes the loop while every slot is busy. Returns when to look again (None: on new
        input): a swap that waits for a set's joiners to show among its members (``SWAP_RETRY_S``)."""
        first = next((r for r in head if not r.aborted), None)
        policy = self._settings.scheduling_policy
        if policy == "fcfs" or first is None or not isinstance(first.key, StepKey):  # fcfs: one level
            return None
        fair = policy == "fair"
        look: Hashable = (first.id, self._flow_heads(head, first.level)) if fair else first.id
        now = self._clock()
        fresh = self._members_at is not None and now - self._members_at < CAPACITY_TTL_S
        if fresh and self._members_for == look:  # nothing woke the loop since this look
            return None
        placeable = self._placeable(sets, head)
        open_workers = {s.worker for s in placeable}  # a set closed or sealed since: its eviction is moot
        self._evicting = {w: rid for w, rid in self._evicting.items() if w in open_workers}
        workers = [s.worker for s in placeable if not s.sealed and (fair or s.key == first.key)]
        if not workers:
            return None
        self._members_at, self._members_for = now, look
        # fair: a sealed set's rows count for their flows too (they run to their end), though none is swapped out
        sealed = [s for s in self._sets or () if s.sealed] if fair else []
        members = self._store.step_levels([*workers, *(s.worker for s in sealed)])
        for worker in workers:  # an eviction is done once its request left the set's levels (requeued or ended)
            if worker in self._evicting and self._evicting[worker] not in {m.request_id for m in members[worker]}:
                del self._evicting[worker]
        if fair:
            self._running = {m.request_id for listed in members.values() for m in listed}
            self._forget_sent(now)
            # a member whose eviction is pending gave its room to its joiner (counted on its way): not to its flow
            members = {w: [m for m in listed if m.request_id != self._evicting.get(w)] for w, listed in members.items()}
        candidates = [
            OpenSet(
                s.worker,
                s.key,
                s.rows,
                s.sealed,
                members=self._members_of(members.get(s.worker, [])),
                evicting=s.worker in self._evicting,
                pending=self._pending(s, members.get(s.worker, [])),
            )
            for s in placeable
            if s.worker in members
        ]
        candidates += [
            OpenSet(
                s.worker,
                s.digest,
                s.rows,
                sealed=True,
                members=self._members_of(members.get(s.worker, [])),
                pending=self._pending(OpenSet(s.worker, s.digest, s.rows), members.get(s.worker, [])),
            )
            for s in sealed
        ]
        decision = preempt(head, candidates, free, self._config)
        if decision is None:
            if fair and self._swap(head, candidates, free):
                self._members_at = None  # read them again then
                return now + SWAP_RETRY_S
            return None
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
        return None

    def _swap(self, head: list[WaitingRequest], sets: list[OpenSet], free: int) -> bool:
        """Make every swap ``scheduler.policy.swap`` allows, each counted in ``sets`` before the next is decided
        (its joiner a member, its eviction pending). Whether to look again soon: several flows wait and requests
        sent to a set do not show among its members yet (a swap may be waiting for them to)."""
        waiting = [replace(r, flow=_flow(q)) if (q := self._queue.get(r.id)) else r for r in head]
        while (decision := swap(waiting, sets, free, self._config)) is not None:
            joiner = next(r for r in waiting if r.id == decision.joiner)
            if not self._join(decision.worker, [joiner.id], waiting, evict=decision.request_id):
                self._members_at = None  # joined plainly, refused or ended: read the sets again at the next look
                self._sets = None
                return False
            self._evicting[decision.worker] = decision.request_id
            waiting = [r for r in waiting if r.id != joiner.id]
            joined = Member(joiner.id, joiner.level, self._wall_clock() * 1000, joiner.flow)
            sets = [_swapped(s, decision.request_id, joined) if s.worker == decision.worker else s for s in sets]
        flows = {r.flow for r in waiting if not r.aborted}
        return len(flows) > 1 and any(s.pending for s in sets)

    def _flow_heads(self, head: Sequence[WaitingRequest], level: int) -> tuple[str, ...]:
        """The first waiting request of each flow and key of ``level`` in the window: what the fair order's swap
        looks at, as far as a new arrival changes it."""
        firsts: dict[Hashable, str] = {}
        for request in head:
            queued = self._queue.get(request.id)
            if not request.aborted and request.level == level and queued is not None:
                firsts.setdefault((_flow(queued), request.key), request.id)
        return tuple(firsts.values())

    def _pending(self, s: OpenSet, members: Sequence[RunningMember]) -> tuple[Hashable, ...]:
        """The flows of the requests we sent to ``s`` that are not among its ``members`` yet: the latest sent, at
        most as many as its count holds past its members (``P:step:rows`` counts what was sent and has not left;
        the levels hash, what runs), so that one that ended unseen does not count."""
        on_way = max(0, s.rows - len(members))
        running = {m.request_id for m in members}
        sent = self._sent.get(s.worker, {})
        latest = sorted((rid for rid in sent if rid not in running), key=sent.__getitem__, reverse=True)
        return tuple(self._flow_of(rid) for rid in latest[:on_way])

    def _flow_of(self, request_id: str) -> Hashable:
        known = self._flows.get(request_id)
        return known[0] if known is not None else None

    def _prune(self, now: float) -> None:
        """At most every ``FLOW_MEMORY_S`` / 4: forget the flows of requests that no set ran when last read and
        that were scheduled over ``FLOW_MEMORY_S`` ago, and the requests sent ``SENT_TTL_S`` ago that never showed
        among their set's members (they ended first, or the set closed)."""
        if now - self._pruned_at < FLOW_MEMORY_S / 4:
            return
        self._pruned_at = now
        self._flows = {
            rid: known for rid, known in self._flows.items() if rid in self._running or now - known[1] < FLOW_MEMORY_S
        }
        self._forget_sent(now)

    def _forget_sent(self, now: float) -> None:
        """Forget the requests sent to a set that ran there when last read (members now), or were sent
        ``SENT_TTL_S`` ago (they ended before any read saw them, or the set closed)."""
        for worker in list(self._sent):
            sent = {rid: at for rid, at in self._sent[worker].items() if now - at < SENT_TTL_S}
            self._sent[worker] = {rid: at for rid, at in sent.items() if rid not in self._running}
            if not self._sent[worker]:
                del self._sent[worker]


def _flow(request: QueuedRequest) -> Hashable:
    """A request's flow in the fair order (``scheduler.queue._FairLevel``): its model and its API key's name."""
    return (key_model(request.key), request.owner)


def _swapped(s: OpenSet, evicted: str, joined: Member) -> OpenSet:
    """``s`` once a swap is sent to it: ``evicted`` out of its members, ``joined`` in, an eviction pending."""
    members = tuple(m for m in s.members if m.id != evicted)
    return replace(s, members=(*members, joined), evicting=True)
