"""The scheduler is SIGKILLed while 1500 requests wait for a worker; its successor recovers every one of them.

The fleet starts with no worker, so the scheduler reads all 1500 stream entries (pending in its consumer group,
unacknowledged) and keeps them waiting. With the default ``scheduler_read_count`` (1000) the new leader must page
through the pending entries to recover them all. Then a NullRunner worker (max_num_seqs 64) joins: every request
ends ``succeeded`` exactly once, and the stream is empty afterwards.
"""

from __future__ import annotations

import time

import pytest
import redis

from shared.keys import SCHEDULER_GROUP
from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import FinishedWatcher, assert_every_request_ended_once, body, statuses, submit_all
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

WAITING = 1500


def test_scheduler_sigkill_with_1500_waiting_requests(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    started = time.monotonic()
    server = chaos_redis()
    fleet = chaos_fleet(server, workers=0, FUSEFLEET_MAX_NUM_SEQS="64")
    assert "FUSEFLEET_SCHEDULER_READ_COUNT" not in fleet.env  # the default (1000): recovery must page

    with FinishedWatcher(server.url, fleet.keys) as watcher:
        ids = submit_all(fleet, [body(f"waiting {i}") for i in range(WAITING)])

        def pending() -> int:
            try:
                return int(fleet.redis.xpending(fleet.keys.requests, SCHEDULER_GROUP)["pending"])
            except redis.ResponseError as exc:  # NOGROUP: the scheduler has not led yet (a busy machine)
                if "NOGROUP" not in str(exc):
                    raise
                return 0

        wait_for(lambda: pending() == WAITING, 30, f"the scheduler to read all {WAITING} entries ({fleet.logs_hint()})")
        assert statuses(fleet, ids) == {"queued": WAITING}

        crashed = fleet.scheduler
        crashed.kill()
        successor = fleet.new_scheduler("scheduler2").start()
        worker = fleet.add_worker("null-worker", FUSEFLEET_RUNNER="bench.runners:NullRunner")
        assert worker.alive() and successor.alive()

        assert_every_request_ended_once(fleet, watcher, ids, timeout=120, killed=[crashed])

    assert fleet.redis.xlen(fleet.keys.requests) == 0, "stream entries left after every request ran"
    assert pending() == 0
    print(f"scheduler crash with {WAITING} waiting: took {time.monotonic() - started:.1f}s")
