"""A step-mode worker's beat comes later than ``worker_ttl_s`` while its running set holds a request: the worker is
frozen (SIGSTOP) past it, its batch's lock still held (``batch_lock_ttl_s`` is longer), and the scheduler's next
free-slot count (``free_slots.lua``, made here by the test as the scheduler's next round would) sweeps the worker with
its set's registration. Once it runs again (SIGCONT), its next beat announces it anew and the set registers again
(``step_reregister.lua``) with its exact count: a compatible request submitted then joins that set at a step boundary
(it ends long before the request that opened it), and the set closes counted to 0, nothing run twice.
"""

from __future__ import annotations

import signal
import time

import pytest

from scheduler.store import SchedulerStore
from shared.settings import Settings
from tests.chaos.conftest import FleetFactory, RedisFactory, step_mode_env
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

STEP_MS = 60  # the simulated denoiser: base 1200 ms / 20 -> 60 ms a step
WORKER_TTL_S = 2.0


def test_a_set_swept_with_a_late_beat_registers_again_and_takes_a_joiner(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    server = chaos_redis()
    fleet = chaos_fleet(
        server,
        workers=1,
        **step_mode_env(STEP_MS),
        FUSEFLEET_WORKER_TTL_S=str(WORKER_TTL_S),
        FUSEFLEET_BATCH_LOCK_TTL_S="30",  # the freeze outlives the worker's beat, not its batch's lock
    )
    worker = fleet.workers[0]
    node = worker.env["FUSEFLEET_WORKER_NAME"]
    keys = fleet.keys
    opener = fleet.submit(prompt="opens the set", num_inference_steps=200)  # about 12 s of steps
    fleet.wait_running(opener, min_step=2)
    digest = fleet.redis.hget(keys.step_sets, node)
    assert digest and fleet.redis.hget(keys.step_rows, node) == "1"

    worker.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    time.sleep(WORKER_TTL_S + 0.5)
    scheduler = SchedulerStore(fleet.redis, Settings(key_prefix=fleet.prefix, worker_ttl_s=WORKER_TTL_S))
    assert scheduler.slots().live == 0  # the sweep: the frozen worker and its set's registration are gone
    assert not fleet.redis.hexists(keys.step_sets, node) and not fleet.redis.hexists(keys.step_rows, node)
    worker.signal(signal.SIGCONT)
    print(f"\nfrozen for {time.monotonic() - frozen_at:.1f} s")

    wait_for(
        lambda: fleet.redis.hexists(keys.step_sets, node),
        10,
        f"the set to register again after the worker's next beat ({fleet.logs_hint()})",
    )
    assert fleet.redis.hget(keys.step_sets, node) == digest
    assert fleet.redis.hget(keys.step_rows, node) == "1"  # the opener alone, as before the sweep
    assert fleet.redis.hget(keys.request(opener), "status") == "running"

    joiner = fleet.submit(prompt="joins it", num_inference_steps=20, guidance_scale=3.0)
    states = fleet.wait_done([opener, joiner], timeout=90)
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys([opener, joiner], "succeeded"), states
    assert fleet.redis.hget(keys.request(joiner), "worker") == node
    finished = {rid: float(fleet.redis.hget(keys.request(rid), "finished_at") or 0) for rid in (opener, joiner)}
    assert finished[joiner] < finished[opener], (finished, fleet.log_excerpt("registered|joined|swept|set "))
    assert "registered again" in fleet.log_excerpt("registered again")
    for rid in (opener, joiner):
        events = [fields["event"] for _, fields in fleet.redis.xrange(keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events.count("running") == 1, events
    wait_for(lambda: not fleet.redis.hexists(keys.step_rows, node), 10, "the set to close")
    assert not fleet.redis.zcard(keys.inflight)
