"""The batch caps the workers announce (``gpu_worker.batch_knee``), as the scheduler applies them: per model and
request pixel cost, the lowest knee among the live workers serving that model (a batch may run on any of them, so
it is capped where the slowest-to-gain one stops gaining). A cost no worker measured has no cap but
``max_num_seqs``. Pure: the announcements in, a lookup out."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from shared.compat import key_model
from shared.contracts import WorkerCapabilities

KNEES_TTL_S = 5.0
"""How long the scheduler uses the knees it read before reading the announcements again (one HGETALL)."""


@dataclass(frozen=True, slots=True)
class KneeCaps:
    """The lowest announced knee by (model, pixel cost)."""

    caps: Mapping[tuple[str, int], int] = field(default_factory=dict)
    only_model: str | None = None  # the fleet's one model, for keys that name none

    @classmethod
    def of(cls, announced: Mapping[str, WorkerCapabilities]) -> KneeCaps:
        caps: dict[tuple[str, int], int] = {}
        models: set[str] = set()
        for capabilities in announced.values():
            for served in capabilities.served:
                models.add(served.model)
                for knee in served.batch_knees:
                    key = (served.model, knee.cost)
                    caps[key] = min(caps.get(key, knee.knee), knee.knee)
        return cls(caps, next(iter(models)) if len(models) == 1 else None)

    def knee(self, key: Hashable, cost: int) -> int | None:
        """The cap of a request of compatibility key ``key`` (its ``model``) and ``cost``; None: none known."""
        model = key_model(key) or self.only_model
        return None if model is None else self.caps.get((model, cost))
