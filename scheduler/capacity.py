"""Each model's room and its own batches, in a fleet of several models (pure: no I/O, no clock).

The scheduler places every batch on one worker (``scheduler.placement``), so it counts, with each count of free
slots, what occupies each worker: the batches in flight that occupy one (``SchedulerStore.busy_models``: batch ->
model) and the worker each was placed on. A model has **room** when ``placement.place`` names a worker for its next
batch now: a free worker that holds it resident, or a free one that should load it. Requests of a model without
room wait aside (``SchedulerService``), in the scheduler, where later arrivals make its batch fuller, so no batch
waits in a busy worker's queue while another worker idles, and an idle worker of another model takes the next
batch of its own. The fleet-wide free slots still bound every dispatch.

The policy (``scheduler.policy.decide``) looks at one model's requests at a time (``decide_by_model``): a batch
holds one model, so another model's request behind the head neither closes the head's batch (strict order) nor
is skipped for it (the models' requests keep their order within each model, and each model's first request its
turn among the models).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
