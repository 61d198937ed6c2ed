"""A worker is SIGKILLed while it holds a batch it claimed ahead (``gpu_worker.lookahead``: taken from the queue and
claimed while its current forward runs, not started): every request of both batches succeeds, exactly once, on the
worker that replaces it, within the bound of a killed worker's running batch (docs/reliability.md).

The batch claimed ahead is locked and held by the dead worker's heartbeat like the running one, so both locks lapse
(``FUSEFLEET_BATCH_LOCK_TTL_S``) and the reaper publishes both again; their unfinished requests run again (as any
lost run: split in halves), and nothing the dead run could still write lands (its claim token is stale).
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

LOCK_TTL_S, FORWARD_S = 3.0, 3.0
BOUND_S = 30.0
"""lock TTL + a reaper pass + the replacement's start + queue wait + the reruns (two halves each of both batches,
3 s forwards) with this VM's slack."""


def test_a_worker_killed_holding_a_batch_claimed_ahead_loses_nothing(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    # a lead far above the forward: the lookahead takes the next batch at the first step after it is published
    fleet = chaos_fleet(
        chaos_redis(),
        workers=0,
        FUSEFLEET_SIM_BASE_MS=str(int(FORWARD_S * 1000)),
        FUSEFLEET_WORKER_LOOKAHEAD_S="60",
        FUSEFLEET_BATCH_LOCK_TTL_S=str(LOCK_TTL_S),
    )
    first = fleet.add_worker("first")
    killed = first.env["FUSEFLEET_WORKER_NAME"]
    running = fleet.submit_batch([{"prompt": f"runs first {i}"} for i in range(4)])  # max_num_seqs 4: one batch
    fleet.wait_running(running[0], min_step=1, timeout=30)
    ahead = fleet.submit_batch([{"prompt": f"claimed ahead {i}"} for i in range(4)])
    # published while the only worker is busy (prefetch), then taken and claimed by it while its forward runs
    wait_for(
        lambda: all(
            (s := fleet.get(rid))["status"] == "running" and s["worker"] == killed and s["progress"]["step"] == 0
            for rid in ahead
        ),
        10,
        "the next batch to be claimed ahead",
    )
    assert fleet.get(running[0])["status"] == "running"  # its forward still runs: the batch ahead has not started
    assert len({fleet.get(rid)["batch_id"] for rid in running + ahead}) == 2
    first.kill()
    killed_at = time.monotonic()
    fleet.add_worker("replacement")
    states = fleet.wait_done(running + ahead, timeout=90)
    took_s = time.monotonic() - killed_at
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(running + ahead, "succeeded"), states
    assert all(states[rid]["worker"] != killed for rid in running + ahead), states
    for rid in running + ahead:
        events = [fields["event"] for _, fields in fleet.redis.xrange(fleet.keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events[-1] == "succeeded", events
    wait_for(lambda: not fleet.redis.zcard(fleet.keys.inflight), 10, "every batch to leave flight")
    assert took_s <= BOUND_S, f"{took_s:.1f} s after the kill"
    print(f"\nevery request ended {took_s:.1f} s after the kill")
