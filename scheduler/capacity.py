"""Each model's room and its own batches, in a fleet of several models (pure: no I/O, no clock).

The scheduler places every batch on one worker (``scheduler.placement``), so it counts, with each count of free
slots, what occupies each worker: the batches in flight that occupy one (``SchedulerStore.capacity``: batch ->
model) and the worker each was placed on. A model has **room** when ``placement.place`` names a worker for its next
batch now: a free worker that holds it resident, or a free one that should load it. Requests of a model without
room wait aside (``SchedulerService``), in the scheduler, where later arrivals make its batch fuller, so no batch
waits in a busy worker's queue while another worker idles, and an idle worker of another model takes the next
batch of its own. The fleet-wide free slots still bound every dispatch.

**Prefetch** (a fleet of one model, request-level mode, the fcfs or priority order): while no worker is free, the
next batch is published before a slot frees, so a worker's next forward need not wait for the scheduler's round trip
(the forward's end frees the slot and wakes the scheduler, which counts, schedules and publishes). At most one batch
waits per live worker (``prefetch_room``), and only one that can grow no more (``prefetch_decide``: full, or closed
by an incompatible request): a batch formed while every worker is busy would otherwise close on the few requests
there yet, where waiting costs it nothing until a worker frees. It waits in the model's queue, held by no worker (a
worker's Celery process fetches its next message only once its running batch is acknowledged: prefetch 1, late
acks), so an idle worker that joins takes it at once, else the first busy worker whose forward comes within
``worker_lookahead_s`` of its end: that worker's lookahead takes and claims it then and runs it right after
(``gpu_worker.lookahead``), or, with the lookahead off, the first worker to free. A worker killed while it waits
holds none of it; one killed after claiming it ahead loses it as a running batch (the reaper publishes it again).
A request that arrives later waits behind it: a batch holds one level, so one of a higher level is never fused into
it, and a partial batch at the head of the queue (a higher level's) stops any prefetch behind it; at most one batch
per worker goes ahead of it. The fair order prefetches nothing: its flows share a level, and a batch
closed as soon as it is full would spread a light flow's requests over several batches (one each) instead of the one
it joins when a slot frees. A fleet of several models places every batch on a free worker (``scheduler.placement``)
and prefetches nothing yet.

The policy (``scheduler.policy.decide``) looks at one model's requests at a time (``decide_by_model``): a batch
holds one model, so another model's request behind the head neither closes the head's batch (strict order) nor
is skipped for it (the models' requests keep their order within each model, and each model's first request its
turn among the models).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduler.placement import holders, place
from scheduler.policy import Decision, Dispatch, PolicyConfig, Wait, WaitingRequest, decide
from shared.compat import key_model
from shared.contracts import WorkerCapabilities


@dataclass
class ModelSlots:
    """What occupies each live worker, and so where each model's next batch may go."""

    announced: Mapping[str, WorkerCapabilities]  # live worker -> what it serves and holds resident
    occupied: Counter[str] = field(default_factory=Counter)  # worker -> batches placed on it occupying it
    busy: Counter[str] = field(default_factory=Counter)  # model -> its batches occupying a worker
    placed: set[tuple[str, str]] = field(default_factory=set)  # (worker, model) of each batch occupying a worker

    @classmethod
    def count(
        cls,
        announced: Mapping[str, WorkerCapabilities],
        busy: Mapping[str, str | None],
        placed: Mapping[str, str],
    ) -> ModelSlots:
        """The slots while ``busy`` (batch id -> its model, None when unknown, for each batch in flight that
        occupies a worker) runs, ``placed`` (batch id -> worker) saying where each went. A batch whose worker is
        not known (placed by an earlier leader, or on its model's queue) counts for its model only."""
        occupied = Counter(placed[batch] for batch in busy if batch in placed)
        models = Counter(model for model in busy.values() if model is not None)
        where = {(placed[batch], model) for batch, model in busy.items() if batch in placed and model is not None}
        return cls(announced, occupied, models, where)

    def target(self, model: str | None, backlog: int = 0) -> str | None:
        """The worker to place a batch of ``model`` on now (``placement.place``), None when none should take it:
        ``backlog`` is the batches its other waiting requests make."""
        if model is None:
            return None
        loading = {worker for worker, of in self.placed if of == model}  # resident by now, or loading it
        return place(holders(model, self.announced, self.occupied, loading), self.busy[model], backlog)

    def has_room(self, model: str | None, backlog: int = 0) -> bool:
        """Whether a batch of ``model`` has a worker to take it now."""
        return self.target(model, backlog) is not None

    def take(self, model: str | None, worker: str | None) -> None:
        """A batch of ``model`` was just placed on ``worker`` (None: its model's queue): it occupies a worker."""
        if model is not None:
            self.busy[model] += 1
        if worker is not None:
            self.occupied[worker] += 1
            if model is not None:
                self.placed.add((worker, model))


def by_model(waiting: Sequence[WaitingRequest]) -> list[list[WaitingRequest]]:
    """``waiting`` split by model (its key's ``model``), in order within each, the models in the order of their
    first request."""
    lanes: dict[str | None, list[WaitingRequest]] = {}
    for request in waiting:
        lanes.setdefault(key_model(request.key), []).append(request)
    return list(lanes.values())


def decide_by_model(waiting: Sequence[WaitingRequest], free_slots: int, now: float, config: PolicyConfig) -> Decision:
    """The policy over each model's requests on their own, models in the order of their first request: the first
    ``Dispatch`` (with every aborted request seen before it); else ``Wait`` until the earliest wait of any model
    (None when none has one) with every aborted request seen."""
    dropped: list[str] = []
    until: float | None = None
    for lane in by_model(waiting):
        decision = decide(lane, free_slots, now, config)
        dropped.extend(decision.dropped_ids)
        if isinstance(decision, Dispatch):
            return Dispatch(decision.request_ids, tuple(dropped))
        if decision.until is not None:
            until = decision.until if until is None else min(until, decision.until)
    return Wait(until, tuple(dropped))


def prefetch_room(free_slots: int, live_workers: int) -> int:
    """How many more batches may be published now to wait for a busy worker: one per live worker (its inbox of depth
    one) counting every batch that occupies a worker, so ``live_workers + free_slots`` (``free_slots``: the live
    workers minus those batches; below 0 once batches wait)."""
    return live_workers + free_slots


def _unwaiting(config: PolicyConfig) -> PolicyConfig:
    """``config`` (and each model's own) with no admission wait that ever ends: only a batch that can grow no more
    is dispatched."""
    never = float("inf")
    own = {model: replace(of, max_wait_s=never, stable_s=never) for model, of in config.by_model.items()}
    return replace(config, max_wait_s=never, stable_s=never, by_model=own)


def prefetch_decide(waiting: Sequence[WaitingRequest], now: float, config: PolicyConfig) -> Decision:
    """The batch to publish while every worker is busy (``prefetch_room``): the policy's batch for one slot when it
    is full or closed, whatever the admission wait says; else ``Wait(None)`` (new input, or a slot that frees, says
    when to look again), with every aborted request seen."""
    decision = decide(waiting, 1, now, _unwaiting(config))
    return decision if isinstance(decision, Dispatch) else Wait(None, decision.dropped_ids)
