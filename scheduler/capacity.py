"""Free worker slots per model, in a fleet of several models (pure: no I/O).

A batch goes to its model's queue or to a worker that serves its model (``shared.routing``), so only a worker that
serves its model can take it. The scheduler counts, with each count of free slots, how many live workers serve each
model (``serving``, from ``SchedulerStore.worker_models``) and the model of each batch in flight that occupies a
worker (``SchedulerStore.busy_models``); a model's room is its workers minus its busy batches. The fleet-wide free
slots still bound every dispatch: a worker that serves several models and runs a batch of one counts for the others
too, and only that fleet-wide count sees it busy. Requests of a model without room wait aside
(``SchedulerService``), so an idle worker of another model takes the next batch of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.contracts import WorkerCapabilities


@dataclass
class ModelSlots:
    """Each model's room: live workers that serve it minus its batches occupying a worker."""

    room: dict[str, int]
    busy: Counter[str] = field(default_factory=Counter)  # each model's batches occupying a worker

    @classmethod
    def count(cls, workers: Mapping[str, int], busy: Iterable[str | None]) -> ModelSlots:
        """The room of each model that ``workers[model]`` live workers serve while ``busy`` (one model per batch
        occupying a worker; None for one whose model is unknown, which counts for no model) runs."""
        taken = Counter(model for model in busy if model is not None)
        return cls({model: served - taken[model] for model, served in workers.items()}, taken)

    def has_room(self, model: str | None) -> bool:
        """Whether a batch of ``model`` has a worker to take it now."""
        return model is not None and self.room.get(model, 0) > 0

    def take(self, model: str | None) -> None:
        """A batch of ``model`` was just published: it occupies one of its workers."""
        if model is not None and model in self.room:
            self.room[model] -= 1
            self.busy[model] += 1


def serving(announced: Mapping[str, WorkerCapabilities]) -> dict[str, int]:
    """How many of the workers ``announced`` (worker -> its announcement) serve each model."""
    served: Counter[str] = Counter()
    for capabilities in announced.values():
        served.update(model.model for model in capabilities.served)
    return dict(served)
