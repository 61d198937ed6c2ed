"""A worker is SIGKILLed while it runs one batch and its next one was already published (prefetch,
``scheduler.capacity``): every request of both succeeds, exactly once, on the worker that replaces it.

The next batch waits in the model's queue, held by no worker: a worker's Celery process fetches its next message
only once the running batch is acknowledged (prefetch 1, late acks), so the kill takes the running batch alone (its
lock lapses and the reaper publishes it again, ``FUSEFLEET_BATCH_LOCK_TTL_S``) and leaves the waiting one to the
next worker that consumes the queue.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def test_a_worker_killed_with_its_next_batch_prefetched_loses_nothing(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    fleet = chaos_fleet(chaos_redis(), workers=0, FUSEFLEET_SIM_BASE_MS="3000")
    first = fleet.add_worker("first")
    killed = first.env["FUSEFLEET_WORKER_NAME"]
    running = fleet.submit_batch([{"prompt": f"runs first {i}"} for i in range(4)])  # max_num_seqs 4: one batch
    fleet.wait_running(running[0], min_step=1, timeout=30)
    prefetched = fleet.submit_batch([{"prompt": f"waits next {i}"} for i in range(4)])
    # published while the only worker is busy: a batch of its own, scheduled before the running one ends
    wait_for(lambda: all(fleet.get(rid)["status"] == "scheduled" for rid in prefetched), 10, "the next batch")
    assert fleet.get(running[0])["status"] == "running"
    assert len({fleet.get(rid)["batch_id"] for rid in running + prefetched}) == 2
    first.kill()
    killed_at = time.monotonic()
    fleet.add_worker("replacement")
    states = fleet.wait_done(running + prefetched, timeout=60)
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(running + prefetched, "succeeded"), states
    assert all(states[rid]["worker"] != killed for rid in running + prefetched), states
    for rid in running + prefetched:
        events = [fields["event"] for _, fields in fleet.redis.xrange(fleet.keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events[-1] == "succeeded", events
    wait_for(lambda: not fleet.redis.zcard(fleet.keys.inflight), 10, "every batch to leave flight")
    print(f"\nevery request ended {time.monotonic() - killed_at:.1f} s after the kill")
