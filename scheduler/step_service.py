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
per key: the next waits until the last is done.

Everything else (leadership, reading, the reaper, deadlines, dispatching to free slots) is the base class's;
``service_for(settings)`` is the one choice between the two.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Any

from scheduler.knees import KNEES_TTL_S
from scheduler.policy import Member, OpenSet, WaitingRequest, place, preempt
from scheduler.row_tasks import RowTasks
from scheduler.service import CAPACITY_TTL_S, SchedulerService
from scheduler.store import RunningSet
from shared.compat import StepKey, step_key
from shared.contracts import RequestSpec
from shared.logging_setup import ids as ids_of
from shared.settings import Settings

log = logging.getLogger(__name__)


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
    _members_for: str | None = None  # the head they were read for (another head reads them again)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._evicting: dict[str, str] = {}  # worker -> the request we asked its set to evict, until it is gone
        self._row_tasks = RowTasks()  # which tasks each model's step rows carry (read with the announcements)
        self._row_tasks_at: float | None = None

    # --- the hooks ----------------------------------------------------------------------------------------------
    def _new_lead(self) -> None:
        super()._new_lead()
        self._evicting.clear()

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

    def _when_full(self, head: list[WaitingRequest], room: Sequence[RunningSet], free: int) -> None:
        self._preempt(head, room, free)

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

    def _join(self, worker: str, request_ids: Sequence[str], head: Sequence[WaitingRequest]) -> None:
        """Schedule these requests into a batch and send it to ``worker``'s running set; publish it to Celery
        instead when the set refuses it (closed, sealed or full meanwhile)."""
        first = next(r for r in head if r.id == request_ids[0])
        assert isinstance(first.key, StepKey)
        batch_id, joined = self._schedule(request_ids)
        if joined:
            message = self._message(batch_id, joined, first.key.model)
            cap = self._config.cap(first)
            fields = ids_of(batch_id=batch_id, worker=worker, request_ids=joined)
            if self._store.step_join(worker, _digest(first.key), message.model_dump_json(), batch_id, len(joined), cap):
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

    def _count_join(self, worker: str, count: int) -> None:
        """Count ``count`` requests just sent to ``worker``'s set against its room in the cached sets."""
        if self._sets is not None:
            self._sets = [
                RunningSet(s.worker, s.digest, s.rows + count) if s.worker == worker else s for s in self._sets
            ]

    # --- preemption ---------------------------------------------------------------------------------------------
    def _preempt(self, head: list[WaitingRequest], sets: Sequence[RunningSet], free: int) -> None:
        """Priority levels: when the head can neither join a set nor start one, ask a set of its key to evict a
        request of a lower level (``scheduler.policy.preempt``). The sets' members are read (one round trip) at
        most once per ``CAPACITY_TTL_S`` for one head unless an event woke the loop; a new head (a higher level's
        arrival) reads them at once: it would otherwise wait for the next worker event, as nothing else wakes the
        loop while every slot is busy."""
        first = next((r for r in head if not r.aborted), None)
        preemption = self._settings.scheduling_policy != "fcfs"  # priority and fair keep levels; fcfs: one level
        if not preemption or first is None or not isinstance(first.key, StepKey):
            return
        now = self._clock()
        fresh = self._members_at is not None and now - self._members_at < CAPACITY_TTL_S
        if fresh and self._members_for == first.id:  # nothing woke the loop since this head looked
            return
        placeable = self._placeable(sets, head)
        open_workers = {s.worker for s in placeable}  # a set closed or sealed since: its eviction is moot
        self._evicting = {w: rid for w, rid in self._evicting.items() if w in open_workers}
        workers = [s.worker for s in placeable if s.key == first.key and not s.sealed]
        if not workers:
            return
        self._members_at, self._members_for = now, first.id
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
