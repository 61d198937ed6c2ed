"""Which worker a batch goes to in a fleet of several models (pure: no I/O, no clock).

A worker that serves several models keeps at most ``max_resident_models`` loaded (``gpu_worker.residency``) and
announces, per model, whether it is resident, the seconds its load took and a moving average of its batches'
seconds (``ModelCapabilities``). The scheduler places every batch on one worker's own queue
(``shared.routing.worker_queue``), so it knows what occupies each worker: the batches it placed there that still
occupy it (running, or waiting in that queue; ``Holder.occupied``). ``place`` chooses by a cost model:

- a **free** worker (nothing of this scheduler's occupies it) that holds the model resident, when there is one (ties
  by name): the batch runs now, with no load;
- else a free worker that must load the model (a cold load: one that holds no other model's only resident copy
  first, so that a load does not leave another model resident nowhere, then the cheapest announced load, ties by
  name), when no live worker holds the model resident, or when the expected wait at its resident workers of the model's
  backlog, ``((busy + backlog) // resident workers) x batch seconds`` (``busy``: the model's batches occupying
  workers; ``backlog``: the batches its requests waiting in the scheduler make), exceeds ``LOAD_MARGIN`` times
  that load;
- else **no worker now** (None): every worker that could take the batch is busy, so its requests wait in the
  scheduler (aside, ``scheduler.capacity``), where later arrivals make its batch fuller, until one frees. A batch
  already scheduled that must go somewhere (published again) takes its model's queue then, where the first worker
  of the model to free takes it.

A worker a batch of the model was placed on to load it counts as resident from then on (busy), so a model resident
nowhere is loaded by one worker, not by every free one while the first load runs; the next worker loads it only
when the wait at those exceeds the margin, as for any resident worker.

Placing on a busy resident worker (a batch waiting in its queue while another worker idles) is what this avoids:
the scheduler's own count says which workers are free, whatever model occupies the others. The margin keeps a
model from being loaded for a wait that a small change in the figures would undo; with the workers' minimum
residency (``min_residency_s``) it is what keeps the fleet from thrashing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from shared.contracts import WorkerCapabilities

LOAD_MARGIN = 2.0
"""A cold load is taken only when the wait it saves is over this many times its seconds."""
DEFAULT_BATCH_S = 1.0
"""A batch's seconds when no resident worker has announced any yet."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A live worker that serves the batch's model, as placement sees it."""

    worker: str
    resident: bool
    load_s: float | None = None  # its last load of the model (None: unknown)
    batch_s: float | None = None  # its moving average of the model's batch seconds (None: none ran)
    occupied: int = 0  # batches this scheduler placed on it that occupy it now (any model's; 0: it is free)
    sole: bool = False  # it holds the only resident copy among the live workers of another model it serves


def holders(
    model: str,
    announced: Mapping[str, WorkerCapabilities],
    occupied: Mapping[str, int],
    loading: Collection[str] = (),
) -> list[Holder]:
    """The workers of ``announced`` (worker -> its announcement) that serve ``model``, with the batches occupying
    each (``occupied``: worker -> count); those of ``loading`` (a batch of the model placed there is loading it)
    count as resident."""
    copies = Counter(served.model for caps in announced.values() for served in caps.served if served.resident)
    out = []
    for worker, capabilities in sorted(announced.items()):
        sole = any(s.resident and s.model != model and copies[s.model] == 1 for s in capabilities.served)
        for served in capabilities.served:
            if served.model == model:
                resident = served.resident or worker in loading
                busy = occupied.get(worker, 0)
                out.append(Holder(worker, resident, served.load_s, served.batch_s, busy, sole))
    return out


def expected_wait_s(busy: int, resident: Sequence[Holder]) -> float:
    """How long a new batch of the model waits for one of its ``resident`` workers while ``busy`` of its batches
    occupy workers: each resident worker runs one at a time."""
    if not resident:
        return float("inf")
    known = [holder.batch_s for holder in resident if holder.batch_s is not None]
    batch_s = sum(known) / len(known) if known else DEFAULT_BATCH_S
    return (max(0, busy) // len(resident)) * batch_s


def place(candidates: Sequence[Holder], busy: int, backlog: int = 0) -> str | None:
    """The worker to place a batch of the model on now (its own queue), or None when none should take it now
    (module docstring). ``candidates``: the live workers that serve the model; ``busy``: its batches occupying
    workers; ``backlog``: the batches its requests waiting behind this one make."""
    resident = [holder for holder in candidates if holder.resident]
    free = [holder for holder in resident if holder.occupied <= 0]
    if free:
        return min(free, key=lambda holder: holder.worker).worker
    cold = [holder for holder in candidates if not holder.resident and holder.occupied <= 0]
    if not cold:
        return None
    cheapest = min(cold, key=lambda h: (h.sole, h.load_s is None, h.load_s or 0.0, h.worker))
    if not resident:
        return cheapest.worker  # a cold load is the only way
    if cheapest.load_s is not None and expected_wait_s(busy + backlog, resident) > LOAD_MARGIN * cheapest.load_s:
        return cheapest.worker
    return None
