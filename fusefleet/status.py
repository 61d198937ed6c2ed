"""``fusefleet status``: what the fleet is doing now, read straight from Redis (``shared.fleet_state``); in a
sharded fleet (``model_shards``) each shard's, under a line of the fleet's totals (``render_fleet``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from shared.contracts import ModelCapabilities
from shared.fleet_state import FleetReader, FleetSnapshot, RunningBatch, WorkerState, merge_snapshots
from shared.keys import RedisKeys
from shared.metrics import RECENT_WINDOW_S
from shared.redis_conn import async_client
from shared.settings import Settings
from shared.shards import HOME, Shards


@dataclass(frozen=True, slots=True)
class FleetStatus:
    """One snapshot of the fleet plus, for each batch holding a slot, who runs it."""

    snapshot: FleetSnapshot
    running: tuple[RunningBatch, ...] = ()


def _residency(model: ModelCapabilities) -> str:
    """Whether the worker holds the model loaded now, and what its last load took."""
    load = f", load {model.load_s:.1f} s" if model.load_s is not None else ""
    return f" (resident{load})" if model.resident else f" (not loaded{load})"


def _knees(model: ModelCapabilities) -> str:
    """The batch cap each measured request pixel cost gets (``gpu_worker.batch_knee``), e.g. ``64x64: 4``."""
    if not model.batch_knees:
        return ""
    caps = ", ".join(f"{_pixels(knee.cost)}: {knee.knee}" for knee in model.batch_knees)
    return f" batch knee {caps}"


def _approximate(model: ModelCapabilities) -> str:
    """The approximate accelerations a model runs with (``gpu_worker.approximations``), where it has any."""
    return f" APPROXIMATE: {model.traits.approximate}" if model.traits.approximate else ""


def _pixels(cost: int) -> str:
    """A pixel cost as a square side where it is one (``64x64``), else the pixel count."""
    side = round(cost**0.5)
    return f"{side}x{side}" if side * side == cost else f"{cost} px"


def _worker_line(worker: WorkerState, batch: RunningBatch | None) -> str:
    state = "live" if worker.live else "stale"
    busy = "idle"
    if batch is not None:
        step = f", step {batch.step}/{batch.total}" if batch.total else ""
        busy = f"busy: batch {batch.batch_id[:8]} ({batch.size} requests{step})"
    beat = f"last beat {worker.last_beat_s:.1f} s ago"
    caps = worker.capabilities
    what = "(announced nothing)"
    if caps is not None:  # each model it serves
        what = "; ".join(
            f"{model.model} {model.pipeline} [{model.traits.family}, "
            f"{'fused' if model.traits.fused else 'request by request'}; "
            f"{', '.join(task.value for task in model.tasks)}]{_residency(model)}{_knees(model)}{_approximate(model)}"
            for model in caps.served
        )
    return f"  {worker.name}: {state}, {busy}, {beat}, {what}"


def render(status: FleetStatus) -> str:
    """The status as plain text: the queue, slots and batches, recent throughput, request counts, then one line per
    worker slot (one slot per worker process)."""
    snapshot = status.snapshot
    counters = snapshot.counters
    by_worker = {batch.worker: batch for batch in status.running if batch.worker is not None}
    unclaimed = [batch for batch in status.running if batch.worker is None]
    finished = ", ".join(f"{count} {name}" for name, count in sorted(counters.finished.items()))
    lines = [
        f"queue: {snapshot.queue_depth} waiting, oldest {snapshot.oldest_waiting_s:.1f} s",
        f"batches in flight: {snapshot.batches_in_flight} on {snapshot.workers_live} live workers "
        f"({snapshot.slots_busy} busy)",
        f"throughput: {snapshot.images_per_s:.2f} images/s over the last {RECENT_WINDOW_S} s "
        f"({snapshot.recent_images} images)",
        f"requests: {counters.accepted} accepted; {finished}",
    ]
    if counters.failures:
        lines.append("failures: " + ", ".join(f"{name} {n}" for name, n in sorted(counters.failures.items())))
    if unclaimed:
        lines.append(f"published, not claimed yet: {', '.join(batch.batch_id[:8] for batch in unclaimed)}")
    lines.append(f"workers ({len(snapshot.workers)}):")
    for worker in sorted(snapshot.workers, key=lambda w: w.name):
        lines.append(_worker_line(worker, by_worker.get(worker.name)))
    return "\n".join(lines)


async def read_status(settings: Settings) -> FleetStatus | None:
    """The status of the fleet ``settings`` names, or None when its Redis does not answer."""
    client = async_client(settings)
    try:
        reader = FleetReader(
            client,
            RedisKeys(settings.key_prefix),
            worker_ttl_s=settings.worker_ttl_s,
            timeout_s=settings.redis_socket_timeout_s,
        )
        snapshot = await reader.read()
        if snapshot is None:
            return None
        running: Sequence[RunningBatch] | None = await reader.running(snapshot.busy_batches)
        return FleetStatus(snapshot, tuple(running or ()))
    finally:
        await client.aclose()


def status(settings: Settings) -> FleetStatus | None:
    return asyncio.run(read_status(settings))


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One shard's status: its name (``HOME``: the fleet's own keys), the models it holds, what its keys say."""

    shard: str
    models: tuple[str, ...]
    status: FleetStatus


def _shard_name(shard: str) -> str:
    return repr(shard) if shard != HOME else "the fleet's own"


def render_fleet(shards: Sequence[ShardStatus]) -> str:
    """The status of every shard: a fleet of one shard as ``render``; several under a line of the fleet's totals
    (the queue, batches in flight, live workers, recent throughput and accepted requests of the shards' snapshots
    summed by ``merge_snapshots``), each shard with its models and its own workers."""
    if len(shards) == 1:
        return render(shards[0].status)
    total = merge_snapshots([shard.status.snapshot for shard in shards])  # as the api's /v1/fleet sums them
    lines = [
        f"fleet: {len(shards)} shards, {total.queue_depth} waiting, {total.batches_in_flight} batches in flight on "
        f"{total.workers_live} live workers ({total.slots_busy} busy), {total.images_per_s:.2f} images/s, "
        f"{total.counters.accepted} requests accepted"
    ]
    for shard in shards:
        lines.append(f"shard {_shard_name(shard.shard)} (models: {', '.join(shard.models)}):")
        lines.extend(f"  {line}" for line in render(shard.status).splitlines())
    return "\n".join(lines)


async def read_fleet_status(settings: Settings) -> tuple[ShardStatus, ...] | None:
    """Every shard's status (``read_status`` over ``Shards.settings_of`` each), or None when Redis does not answer
    for one of them."""
    shards = Shards(settings)
    read = await asyncio.gather(*(read_status(shards.settings_of(shard)) for shard in shards.names))
    if any(one is None for one in read):
        return None
    return tuple(
        ShardStatus(shard, shards.models_of(shard), one)
        for shard, one in zip(shards.names, read, strict=True)
        if one is not None
    )


def fleet_status(settings: Settings) -> tuple[ShardStatus, ...] | None:
    return asyncio.run(read_fleet_status(settings))
