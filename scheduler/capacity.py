"""Free worker slots per model, in a fleet of several models (pure: no I/O).

A batch goes to its model's queue (``shared.routing``), so only a worker that serves its model can take it. The
scheduler counts, with each count of free slots, how many live workers serve each model and the model of each
batch in flight that occupies a worker (``SchedulerStore.model_workers``, ``SchedulerStore.busy_models``); a
model's room is its workers minus its busy batches. The fleet-wide free slots still bound every dispatch: a worker
that serves several models and runs a batch of one counts for the others too, and only that fleet-wide count sees
it busy. Requests of a model without room wait aside (``SchedulerService``), so an idle worker of another model
takes the next batch of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass
class ModelSlots:
    """Each model's room: live workers that serve it minus its batches occupying a worker."""

    room: dict[str, int]

    @classmethod
    def count(cls, workers: Mapping[str, int], busy: Iterable[str | None]) -> ModelSlots:
        """The room of each model that ``workers[model]`` live workers serve while ``busy`` (one model per batch
        occupying a worker; None for one whose model is unknown, which counts for no model) runs."""
        taken = Counter(model for model in busy if model is not None)
        return cls({model: served - taken[model] for model, served in workers.items()})

    def has_room(self, model: str | None) -> bool:
        """Whether a batch of ``model`` has a worker to take it now."""
        return model is not None and self.room.get(model, 0) > 0

    def take(self, model: str | None) -> None:
        """A batch of ``model`` was just published: it occupies one of its workers."""
        if model is not None and model in self.room:
            self.room[model] -= 1
