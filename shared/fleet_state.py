"""What the fleet is doing right now, read from Redis in one pipelined round trip (Redis time throughout): the
queue, the batches in flight, the live workers and what each announces, and the fleet's counters
(``shared.metrics``). Used by the api's ``/metrics`` and by ``fusefleet status`` (which also asks which worker
runs which batch: ``FleetReader.running``); a sharded fleet's is its shards' summed (``merge_snapshots``), for both."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared.contracts import RequestStatus, WorkerCapabilities
from shared.keys import RedisKeys
from shared.metrics import RECENT_WINDOW_S, FleetCounters, parse_counters, recent_images


def accepted_count(stream_info: Any, counters: dict[str, str]) -> int:
    """Requests the fleet ever accepted: the entries ever added to the request stream (``XINFO STREAM``'s
    ``entries-added``: one by ``submit.lua`` per request it accepts, atomically with it, and one by ``requeue.lua`` per
    request it puts back, which counts it in ``P:metrics`` as ``requeued``) less the requeued ones. No command of the
    submission counts it; 0 before the stream exists (``stream_info`` then the error its ``XINFO`` answered)."""
    if isinstance(stream_info, Exception) or not isinstance(stream_info, dict):
        return 0
    added = int(stream_info.get("entries-added") or 0)
    return max(0, added - int(float(counters.get("requeued") or 0)))


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker slot as its heartbeat left it: when it last beat, and what it announced (None if nothing)."""

    name: str
    last_beat_s: float
    live: bool
    capabilities: WorkerCapabilities | None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What one read of Redis found. ``busy_batches`` are the batches in flight that hold a worker slot (all but
    those whose forward is over while their outputs are stored, as ``free_slots.lua`` counts them);
    ``recent_images`` were produced in the last ``RECENT_WINDOW_S`` seconds; ``input_bytes`` are held by the input
    images of unfinished requests (``P:inputs:bytes``, under ``max_queued_input_bytes``)."""

    queue_depth: int
    oldest_waiting_s: float
    batches_in_flight: int
    workers: tuple[WorkerState, ...] = ()
    busy_batches: tuple[str, ...] = ()
    counters: FleetCounters = field(default_factory=FleetCounters)
    recent_images: int = 0
    input_bytes: int = 0

    @property
    def workers_live(self) -> int:
        return sum(1 for worker in self.workers if worker.live)

    @property
    def slots_busy(self) -> int:
        return len(self.busy_batches)

    @property
    def images_per_s(self) -> float:
        """Recent throughput: images per second over the last ``RECENT_WINDOW_S`` seconds."""
        return self.recent_images / RECENT_WINDOW_S


@dataclass(frozen=True, slots=True)
class RunningBatch:
    """A batch holding a slot: its requests, the worker running them (None until claimed) and the step it is at."""

    batch_id: str
    size: int
    worker: str | None
    step: int
    total: int


def _sum(a: Any, b: Any) -> Any:
    """Two counters' values added: numbers, tuples element-wise, dicts key-wise."""
    if isinstance(a, dict):
        return {key: _sum(a[key], b[key]) if key in a and key in b else a.get(key, b.get(key)) for key in {**a, **b}}
    if isinstance(a, tuple):
        return tuple(_sum(x, y) for x, y in zip(a, b, strict=True))
    return a + b


def merge_counters(counters: Sequence[FleetCounters]) -> FleetCounters:
    """Every field of ``counters`` summed (counts, sums, histograms' buckets)."""
    first, *rest = counters
    values = {item.name: getattr(first, item.name) for item in fields(FleetCounters)}
    for more in rest:
        values = {name: _sum(value, getattr(more, name)) for name, value in values.items()}
    return FleetCounters(**values)


def merge_snapshots(snapshots: Sequence[FleetSnapshot]) -> FleetSnapshot:
    """The fleet of several shards' snapshots: queues, batches, bytes and counters summed, workers and busy batches
    joined, the oldest wait the longest."""
    return FleetSnapshot(
        queue_depth=sum(snapshot.queue_depth for snapshot in snapshots),
        oldest_waiting_s=max(snapshot.oldest_waiting_s for snapshot in snapshots),
        batches_in_flight=sum(snapshot.batches_in_flight for snapshot in snapshots),
        workers=tuple(worker for snapshot in snapshots for worker in snapshot.workers),
        busy_batches=tuple(batch for snapshot in snapshots for batch in snapshot.busy_batches),
        counters=merge_counters([snapshot.counters for snapshot in snapshots]),
        recent_images=sum(snapshot.recent_images for snapshot in snapshots),
        input_bytes=sum(snapshot.input_bytes for snapshot in snapshots),
    )


class FleetReader:
    """Reads the fleet gauges of one scrape: one pipelined round trip, bounded by ``timeout_s``."""

    def __init__(self, redis: aioredis.Redis, keys: RedisKeys, *, worker_ttl_s: float, timeout_s: float) -> None:
        self._redis = redis
        self._keys = keys
        self._worker_ttl_ms = worker_ttl_s * 1000
        self._timeout_s = timeout_s

    async def read(self) -> FleetSnapshot | None:
        """The gauges, or None when Redis fails or does not answer in time."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        pipe.xlen(self._keys.requests)
        pipe.xrange(self._keys.requests, count=1)
        pipe.zrange(self._keys.inflight, 0, -1)
        pipe.zrange(self._keys.storing, 0, -1)
        pipe.zrange(self._keys.workers, 0, -1, withscores=True)
        pipe.hgetall(self._keys.capabilities)
        pipe.hgetall(self._keys.metrics)
        pipe.hgetall(self._keys.metrics_recent)
        pipe.get(self._keys.input_bytes)
        pipe.xinfo_stream(self._keys.requests)  # its entries added: the accepted count (``accepted_count``)
        try:
            async with asyncio.timeout(self._timeout_s):
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError):  # down, stalled (timeout) or loading: no snapshot
            return None
        *replies, stream = replies
        if any(isinstance(reply, Exception) for reply in replies):
            return None
        (seconds, micros), depth, first, inflight, storing, workers, announced, counters, ring, inputs = replies
        storing_set = set(storing)
        now_ms = int(seconds) * 1000 + int(micros) / 1000
        oldest_s = 0.0
        if first:
            entry_ms = int(str(first[0][0]).split("-", 1)[0])
            oldest_s = max(0.0, (now_ms - entry_ms) / 1000)
        states = tuple(
            WorkerState(
                name=str(name),
                last_beat_s=max(0.0, (now_ms - float(score)) / 1000),
                live=now_ms - float(score) < self._worker_ttl_ms,
                capabilities=parse_capabilities(announced.get(name)),
            )
            for name, score in workers
        )
        return FleetSnapshot(
            int(depth),
            oldest_s,
            len(inflight),
            states,
            busy_batches=tuple(str(batch) for batch in inflight if batch not in storing_set),
            counters=replace(parse_counters(counters), accepted=accepted_count(stream, counters)),
            recent_images=recent_images(ring, int(seconds)),
            input_bytes=int(inputs or 0),
        )

    async def running(self, batch_ids: tuple[str, ...]) -> list[RunningBatch] | None:
        """Who runs each of these batches and how far it got (two more round trips), or None when Redis fails."""
        try:
            async with asyncio.timeout(self._timeout_s):
                pipe = self._redis.pipeline(transaction=False)
                for batch_id in batch_ids:
                    pipe.hget(self._keys.batch(batch_id), "ids")
                members = [str(ids or "").split() for ids in await pipe.execute()]
                pipe = self._redis.pipeline(transaction=False)
                for request_id in (rid for ids in members for rid in ids):
                    pipe.hmget(self._keys.request(request_id), ["status", "worker", "step", "total"])
                rows = iter(await pipe.execute())
        except (RedisError, OSError):
            return None
        out = []
        for batch_id, ids in zip(batch_ids, members, strict=True):
            held = [row for row in (next(rows) for _ in ids) if row[0] == RequestStatus.RUNNING and row[1]]
            if held:
                _, worker, step, total = held[0]
                out.append(RunningBatch(batch_id, len(ids), str(worker), int(step or 0), int(total or 0)))
            else:  # published, not claimed yet (or between runs)
                out.append(RunningBatch(batch_id, len(ids), None, 0, 0))
        return out


def parse_capabilities(raw: str | bytes | None) -> WorkerCapabilities | None:
    """A worker's announcement (``P:capabilities``), or None when absent or unreadable."""
    try:
        return WorkerCapabilities.model_validate_json(raw) if raw else None
    except ValueError:  # from another version: shown as unknown
        return None
