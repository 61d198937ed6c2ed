"""Where a batch goes in a fleet whose workers hold some of their models resident (pure: no I/O, no clock).

A worker that serves several models keeps at most ``max_resident_models`` loaded (``gpu_worker.residency``) and
announces, per model, whether it is resident, the seconds its load took and a moving average of its batches'
seconds (``ModelCapabilities``). A batch published to its model's queue is taken by whichever worker serving the
model frees first, which may be one that must load it first (a cold load); a batch published to one worker's own
queue (``shared.routing.worker_queue``) runs where its model is resident. ``place`` chooses by a cost model:

- every live worker of the model holds it resident, or none does: the model's queue (no load to avoid, or none
  to prefer);
- otherwise, a resident worker when one is free for the batch now (``busy``, the model's batches occupying
  workers, below the resident workers); else the expected wait at the resident workers of the model's backlog,
  ``((busy + backlog) // resident workers) x batch seconds`` (``backlog``: the batches the model's requests still
  waiting in the scheduler make; each resident worker takes one at a time), against the cheapest announced load:
  a cold load is taken (the model's queue, where an idle worker that must load it, or the first resident worker
  to free up, takes it) only when the wait exceeds ``LOAD_MARGIN`` times the load seconds; else the resident
  worker this scheduler placed the fewest batches in flight on (ties by name).

The margin keeps a model from being loaded for a wait that a small change in the figures would undo; with the
workers' minimum residency (``min_residency_s``) it is what keeps the fleet from thrashing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    placed: int = 0  # batches this scheduler placed on it that are still in flight


def holders(model: str, announced: Mapping[str, WorkerCapabilities], placed: Mapping[str, int]) -> list[Holder]:
    """The workers of ``announced`` (worker -> its announcement) that serve ``model``, with the batches placed on
    each (``placed``: worker -> count)."""
    out = []
    for worker, capabilities in sorted(announced.items()):
        for served in capabilities.served:
            if served.model == model:
                out.append(Holder(worker, served.resident, served.load_s, served.batch_s, placed.get(worker, 0)))
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
    """The worker to place a batch of the model on (its own queue), or None for the model's queue (module
    docstring). ``candidates``: the live workers that serve the model; ``busy``: its batches occupying workers;
    ``backlog``: the batches its requests waiting behind this one make."""
    resident = [holder for holder in candidates if holder.resident]
    cold = [holder for holder in candidates if not holder.resident]
    if not resident or not cold:
        return None
    loads = [holder.load_s for holder in cold if holder.load_s is not None]
    waiting = busy + backlog if busy >= len(resident) else 0  # a resident worker free now: no wait for this one
    if loads and expected_wait_s(waiting, resident) > LOAD_MARGIN * min(loads):
        return None
    return min(resident, key=lambda holder: (holder.placed, holder.worker)).worker
