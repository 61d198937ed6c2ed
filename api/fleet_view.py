"""The answer of ``GET /v1/fleet``: the fleet right now, as JSON (what ``fusefleet status`` prints and ``/metrics``
exports), built from one ``FleetSnapshot`` and the batches holding a worker slot (``shared.fleet_state``).

Fleet-wide numbers only: no request id, prompt or API key name appears in it, so any key may read it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from shared.contracts import Frozen
from shared.fleet_state import FleetSnapshot, RunningBatch, WorkerState


class FleetBatch(Frozen):
    """A batch holding a worker slot: published (``worker`` null until claimed) or running."""

    batch_id: str
    size: int = Field(description="Requests in the batch.")
    worker: str | None = Field(description="The worker running it; null while published, not claimed yet.")
    step: int = Field(description="The denoising step it reached (0 before the first).")
    total: int = Field(description="Its steps (0 until a worker reports them).")


class FleetWorker(Frozen):
    """One worker slot (one per worker process), as its heartbeat left it."""

    name: str
    live: bool = Field(description="Its heartbeat is newer than worker_ttl_s.")
    last_beat_s: float = Field(description="Seconds since its last heartbeat (Redis time).")
    model: str | None = Field(description="The first model it announced (null: announced nothing).")
    pipeline: str | None = Field(description="Its pipeline (or runner) class of that model.")
    models: tuple[str, ...] = Field((), description="Every model it serves (FUSEFLEET_WORKER_MODELS).")
    resident: tuple[str, ...] = Field(
        (), description="The models of those it holds loaded now (at most FUSEFLEET_MAX_RESIDENT_MODELS)."
    )
    batch: FleetBatch | None = Field(description="The batch it runs now; null when idle.")


class FleetView(Frozen):
    """The fleet now. ``batch_sizes`` counts every batch the scheduler formed, by the requests in it (the
    ``fusefleet_batch_size`` histogram, exact): two reads apart, their difference is the batches formed in between.
    """

    queue_depth: int = Field(description="Requests waiting in the request stream.")
    oldest_waiting_s: float = Field(description="Age of the oldest waiting request (0 when none waits).")
    batches_in_flight: int = Field(description="Batches published with unfinished requests.")
    workers_live: int = Field(description="Worker slots whose heartbeat is newer than worker_ttl_s.")
    images_per_s: float = Field(description="Images produced per second over the last minute.")
    requests_accepted: int = Field(description="Requests accepted, fleet-wide.")
    requests_finished: dict[str, int] = Field(description="Requests that ended, by terminal status.")
    batch_sizes: dict[int, int] = Field(description="Batches formed so far, by requests in them (size -> batches).")
    batches: tuple[FleetBatch, ...] = Field(description="The batches holding a worker slot, oldest first.")
    workers: tuple[FleetWorker, ...] = Field(description="Every worker slot with a heartbeat entry, by name.")


def _worker(state: WorkerState, batch: FleetBatch | None) -> FleetWorker:
    caps = state.capabilities
    return FleetWorker(
        name=state.name,
        live=state.live,
        last_beat_s=round(state.last_beat_s, 3),
        model=caps.model if caps is not None else None,
        pipeline=caps.pipeline if caps is not None else None,
        models=tuple(model.model for model in caps.served) if caps is not None else (),
        resident=tuple(model.model for model in caps.served if model.resident) if caps is not None else (),
        batch=batch,
    )


def fleet_view(snapshot: FleetSnapshot, running: Sequence[RunningBatch]) -> FleetView:
    """The view of ``snapshot`` whose slot-holding batches are ``running`` (``FleetReader.running``)."""
    batches = tuple(
        FleetBatch(batch_id=batch.batch_id, size=batch.size, worker=batch.worker, step=batch.step, total=batch.total)
        for batch in running
    )
    by_worker = {batch.worker: batch for batch in batches if batch.worker is not None}
    counters = snapshot.counters
    return FleetView(
        queue_depth=snapshot.queue_depth,
        oldest_waiting_s=round(snapshot.oldest_waiting_s, 3),
        batches_in_flight=snapshot.batches_in_flight,
        workers_live=snapshot.workers_live,
        images_per_s=round(snapshot.images_per_s, 3),
        requests_accepted=counters.accepted,
        requests_finished=dict(counters.finished),
        batch_sizes=dict(sorted(counters.batch_sizes.items())),
        batches=batches,
        workers=tuple(
            _worker(state, by_worker.get(state.name)) for state in sorted(snapshot.workers, key=lambda w: w.name)
        ),
    )
