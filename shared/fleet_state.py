"""What the fleet is doing right now, read from Redis in one pipelined round trip (Redis time throughout): the
queue, the batches in flight, the live workers and what each announces. Used by the api's ``/metrics`` and by
``fusefleet status``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared.contracts import WorkerCapabilities
from shared.keys import RedisKeys


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker slot as its heartbeat left it: when it last beat, and what it announced (None if nothing)."""

    name: str
    last_beat_s: float
    live: bool
    capabilities: WorkerCapabilities | None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What one read of Redis found."""

    queue_depth: int
    oldest_waiting_s: float
    batches_in_flight: int
    workers: tuple[WorkerState, ...] = ()

    @property
    def workers_live(self) -> int:
        return sum(1 for worker in self.workers if worker.live)


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
        pipe.zcard(self._keys.inflight)
        pipe.zrange(self._keys.workers, 0, -1, withscores=True)
        pipe.hgetall(self._keys.capabilities)
        try:
            async with asyncio.timeout(self._timeout_s):
                (seconds, micros), depth, first, inflight, workers, announced = await pipe.execute()
        except (RedisError, OSError):  # down, stalled (timeout) or loading: no snapshot
            return None
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
        return FleetSnapshot(int(depth), oldest_s, int(inflight), states)


def parse_capabilities(raw: str | bytes | None) -> WorkerCapabilities | None:
    """A worker's announcement (``P:capabilities``), or None when absent or unreadable."""
    try:
        return WorkerCapabilities.model_validate_json(raw) if raw else None
    except ValueError:  # from another version: shown as unknown
        return None
