"""``fusefleet status``: what the fleet is doing now, read straight from Redis (``shared.fleet_state``)."""

from __future__ import annotations

import asyncio

from shared.fleet_state import FleetReader, FleetSnapshot
from shared.keys import RedisKeys
from shared.redis_conn import async_client
from shared.settings import Settings


def render(snapshot: FleetSnapshot) -> str:
    """The status as plain text: the queue, the batches in flight, then one line per worker slot."""
    lines = [
        f"queue: {snapshot.queue_depth} waiting, oldest {snapshot.oldest_waiting_s:.1f} s",
        f"batches in flight: {snapshot.batches_in_flight} on {snapshot.workers_live} live workers",
        f"workers ({len(snapshot.workers)}):",
    ]
    for worker in sorted(snapshot.workers, key=lambda w: w.name):
        state = "live" if worker.live else "stale"
        beat = f"last beat {worker.last_beat_s:.1f} s ago"
        caps = worker.capabilities
        what = "(announced nothing)"
        if caps is not None:
            tasks = ", ".join(task.value for task in caps.tasks)
            fused = "fused" if caps.traits.fused else "request by request"
            what = f"{caps.model} {caps.pipeline} [{caps.traits.family}, {fused}; {tasks}]"
        lines.append(f"  {worker.name}: {state}, {beat}, {what}")
    return "\n".join(lines)


async def read_status(settings: Settings) -> FleetSnapshot | None:
    """One snapshot of the fleet ``settings`` names, or None when its Redis does not answer."""
    client = async_client(settings)
    try:
        reader = FleetReader(
            client,
            RedisKeys(settings.key_prefix),
            worker_ttl_s=settings.worker_ttl_s,
            timeout_s=settings.redis_socket_timeout_s,
        )
        return await reader.read()
    finally:
        await client.aclose()


def status(settings: Settings) -> FleetSnapshot | None:
    return asyncio.run(read_status(settings))
