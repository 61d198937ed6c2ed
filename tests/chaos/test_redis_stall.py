"""Redis stalls (SIGSTOP) for longer than a running batch's lock TTL, then resumes (SIGCONT).

A batch of 4 runs on one of 2 workers (20 steps x 400 ms). Redis is stopped for 4 s, from the forward's first
step, with a 2 s lock TTL: when it resumes the lock has lapsed while the first worker still has seconds of its
forward left, so the scheduler's reaper publishes the batch again and the other worker runs it while the first
("stale") one is still in its forward. Whatever happens, no request may end twice, the result a client saw
first must stay the result (``finished_at`` and PNG bytes read right after the first terminal publication equal
later reads; ``ChaosRunner`` draws fresh noise on every run, so an overwrite by the stale run would show), and
every request ends ``succeeded``.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import FinishedWatcher, assert_every_request_ended_once, body, statuses
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

LOCK_TTL_S = 2.0
STALL_S = 4.0
STEPS = 20
FORWARD_S = 8.0  # 20 steps x 400 ms for the batch of 4 (2 s per image: a later single request takes 2 s)


def test_redis_sigstop_longer_than_the_lock_ttl(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    started = time.monotonic()
    server = chaos_redis()
    fleet = chaos_fleet(
        server,
        workers=2,
        FUSEFLEET_BATCH_LOCK_TTL_S=str(LOCK_TTL_S),
        FUSEFLEET_SIM_BASE_MS="0",
        FUSEFLEET_SIM_PER_IMAGE_MS=str(FORWARD_S * 1000 / 4),
        FUSEFLEET_REDIS_SOCKET_TIMEOUT_S="1.5",
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="300",
    )
    with FinishedWatcher(server.url, fleet.keys, capture_images=True) as watcher:
        ids = fleet.submit_batch([body(f"stall {i}", steps=STEPS) for i in range(4)])
        first_worker = fleet.wait_running(ids[0], min_step=1)["worker"]
        assert statuses(fleet, ids) == {"running": 4}, "the 4 requests should run as one batch"

        server.pause()
        try:
            time.sleep(STALL_S)
        finally:
            server.resume()
        resumed_at = time.monotonic()

        finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=90)
        for rid in ids:
            assert finishes[rid].image, f"no image right after {rid} succeeded"

        # let the stale run (if any) finish its forward and try to write, then read everything again
        wait_for(
            lambda: time.monotonic() - resumed_at > FORWARD_S + 2 and not fleet.redis.zcard(fleet.keys.inflight),
            60,
            f"every batch to be done ({fleet.logs_hint()})",
        )
        for rid in ids:
            state = fleet.get(rid)
            assert state["status"] == "succeeded", state
            again = fleet.redis.hget(fleet.keys.request(rid), "finished_at")
            first = finishes[rid].finished_at
            assert again == first, f"{rid} finished again: {first!r} -> {again!r}"
            assert fleet.image(rid) == finishes[rid].image, f"the stored image of {rid} changed after it succeeded"
        assert all(watcher.count(rid) == 1 for rid in ids)

    workers = {fleet.get(rid)["worker"] for rid in ids}
    batch = fleet.redis.hgetall(fleet.keys.batch(fleet.get(ids[0])["batch_id"]))
    print(
        f"redis stall: ran first on {first_worker}, results by {workers}, batch {batch}; "
        f"took {time.monotonic() - started:.1f}s"
    )
