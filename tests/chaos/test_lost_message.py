"""A published batch whose Celery message is lost is published again by the scheduler's reaper.

No real worker at first: a fake heartbeat in ``P:workers`` makes the scheduler see one free slot, so it moves 4
requests into a batch and publishes it. The test deletes the message from the broker list (the queue named
``FUSEFLEET_QUEUE_NAME``) before anyone takes it, stops the fake heartbeat and starts a real worker. The batch is
never claimed and its message is gone, so after ``batch_claim_timeout_s`` (2 s here) the reaper publishes it
again; the real worker runs it and the requests succeed, each once, in their original batch.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import (
    FakeWorkerHeartbeat,
    FinishedWatcher,
    assert_every_request_ended_once,
    body,
    statuses,
)
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]


def test_lost_batch_message_is_published_again(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    started = time.monotonic()
    server = chaos_redis()
    fleet = chaos_fleet(
        server, workers=0, FUSEFLEET_BATCH_CLAIM_TIMEOUT_S="2", FUSEFLEET_RUNNER="bench.runners:NullRunner"
    )
    queue = f"{fleet.prefix}:{fleet.env['FUSEFLEET_QUEUE_NAME']}"  # its list in the broker (broker_key_prefix)

    with FinishedWatcher(server.url, fleet.keys) as watcher:
        ghost = FakeWorkerHeartbeat(fleet.redis, fleet.keys, f"ghost@{fleet.prefix}").start()
        try:
            ids = fleet.submit_batch([body(f"lost {i}") for i in range(4)])
            wait_for(lambda: fleet.redis.llen(queue) >= 1, 20, f"the batch message in {queue} ({fleet.logs_hint()})")
            assert fleet.redis.delete(queue) == 1  # the message is lost
            assert statuses(fleet, ids) == {"scheduled": 4}
            (batch_id,) = {fleet.redis.hget(fleet.keys.request(rid), "batch_id") for rid in ids}
        finally:
            ghost.stop()
        fleet.add_worker("real-worker")
        lost_at = time.monotonic()

        finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=60)

    recovered_s = max(float(f.finished_at or 0) for f in finishes.values()) - (time.time() - time.monotonic())
    assert {fleet.redis.hget(fleet.keys.request(rid), "batch_id") for rid in ids} == {batch_id}
    print(
        f"lost message: batch ran {recovered_s - lost_at:.1f}s after the real worker joined; "
        f"took {time.monotonic() - started:.1f}s"
    )
