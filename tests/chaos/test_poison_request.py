"""A request whose run kills its worker process, fused with 3 good ones: only it fails, the others succeed.

``ChaosRunner`` SIGKILLs its own pool process after step 1 of any forward holding the ``chaos:kill-worker``
prompt (a segfault, the OOM killer: nothing in the process can catch it). The 4 requests run as one fused batch on
one real Celery worker; each lost run's lock lapses (3 s here), the reaper publishes the batch again and
``claim.lua`` re-runs it split (``lib_split_plan.lua``): the half without the culprit succeeds, the half with it
is split again, and the culprit, lost ``max_batch_attempts`` (3) times running alone, fails ``WorkerLost``. With
N = 4 that is log2 4 + 3 = 5 runs that kill the worker (2 with others, 3 alone) and 2 that succeed.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import CHAOS_ENV, FleetFactory, RedisFactory
from tests.support.chaos import Finish, FinishedWatcher, assert_every_request_ended_once, body
from tests.support.runners import KILL_WORKER

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

LOCK_TTL_S = float(CHAOS_ENV["FUSEFLEET_BATCH_LOCK_TTL_S"])
REAPER_S = 1.0
ALONE = 3  # A: the culprit's lost runs alone
LOST_RUNS, GOOD_RUNS = 2 + ALONE, 2  # ceil(log2 N) + A and at most ceil(log2 N), for N = 4
RESTART_S = 5.0  # a pool process replaced and its message taken again, on a busy 2-core machine
BOUND_S = LOST_RUNS * (LOCK_TTL_S + REAPER_S + RESTART_S) + GOOD_RUNS * (REAPER_S + RESTART_S)


def test_a_request_that_kills_its_worker_fails_alone(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    server = chaos_redis()
    fleet = chaos_fleet(server, workers=1, FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="300")
    prompts = ["good 0", "good 1", f"poison {KILL_WORKER}", "good 3"]
    with FinishedWatcher(server.url, fleet.keys) as watcher:
        started = time.time()
        ids = fleet.submit_batch([body(prompt, steps=4) for prompt in prompts])
        poison = ids[2]

        def expect(rid: str, finish: Finish) -> str | None:
            if rid != poison:
                return None if finish.status == "succeeded" else f"a good request ended {finish}"
            if finish.status != "failed" or finish.error_type != "WorkerLost":
                return f"the poison request ended {finish}, expected failed WorkerLost"
            message = finish.error_message or ""
            return None if f"killed the worker {ALONE} times running alone" in message else f"its message: {message!r}"

        assert_every_request_ended_once(fleet, watcher, ids, timeout=BOUND_S + 30, expect=expect)
        finishes = watcher.firsts()
    took_s = max(float(finishes[rid].finished_at or 0) for rid in ids) - started  # the workers' clock: this host's
    states = [fleet.get(rid) for rid in ids]
    assert len({s["batch_id"] for s in states}) == 1 and {s["batch_size"] for s in states} == {4}, states
    batch = fleet.redis.hgetall(fleet.keys.batch(states[0]["batch_id"]))
    assert batch.get(f"lost:{poison}") == str(LOST_RUNS) and batch.get(f"lost_alone:{poison}") == str(ALONE), batch
    assert int(batch["attempts"]) == LOST_RUNS + GOOD_RUNS, batch
    print(
        f"\npoison request in a fused batch of 4: it failed WorkerLost, its 3 peers succeeded, all ended "
        f"{took_s:.1f} s after submission ({LOST_RUNS} lost runs + {GOOD_RUNS} good ones, lock {LOCK_TTL_S:.0f} s; "
        f"bound {BOUND_S:.0f} s)"
    )
    assert took_s <= BOUND_S, f"took {took_s:.1f} s, over the stated bound of {BOUND_S:.0f} s"
