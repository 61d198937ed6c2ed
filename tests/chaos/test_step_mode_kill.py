"""A step-mode worker is SIGKILLed while its running set holds requests of several batches (the one that opened the
set, one that joined it, one waiting in its inbox): nothing is lost. The batches it held are published again once
their locks lapse, the one in its inbox once its claim timeout passes, and each request ends ``succeeded`` exactly
once, on the worker that replaced it.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory, step_mode_env
from tests.support.processes import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

STEP_MS = 20  # the simulated denoiser: (base + per image x rows) / 20 per step; base 400 ms -> 20 ms a step


def test_a_killed_step_mode_worker_loses_nothing(chaos_redis: RedisFactory, chaos_fleet: FleetFactory) -> None:
    server = chaos_redis()
    fleet = chaos_fleet(server, workers=1, **step_mode_env(STEP_MS))
    first = fleet.workers[0]
    node = first.env["FUSEFLEET_WORKER_NAME"]
    opener = fleet.submit(prompt="opens the set", num_inference_steps=150)
    fleet.wait_running(opener, min_step=2)
    joiner = fleet.submit(prompt="joins it", num_inference_steps=120, guidance_scale=3.0)
    fleet.wait_running(joiner, min_step=2)
    assert fleet.redis.hget(fleet.keys.request(joiner), "batch_id") != fleet.redis.hget(
        fleet.keys.request(opener), "batch_id"
    )
    assert fleet.redis.hget(fleet.keys.request(joiner), "worker") == node

    first.signal(signal.SIGSTOP)  # frozen: its heartbeat still counts for worker_ttl_s, so a join is sent to it
    waiting = fleet.submit(prompt="waits in its inbox", num_inference_steps=30)

    def sent_to_the_set() -> bool:  # step_join.lua: in its inbox, or already in the socket of its inbox read (BLPOP)
        batch = fleet.redis.hget(fleet.keys.request(waiting), "batch_id")
        return bool(batch) and fleet.redis.zscore(fleet.keys.storing, batch) is not None

    wait_for(sent_to_the_set, 5, f"a batch to be sent to the frozen worker's inbox ({fleet.logs_hint()})")
    first.kill()
    killed_at = time.monotonic()
    fleet.add_worker("second")
    ids = [opener, joiner, waiting]
    states = fleet.wait_done(ids, timeout=90)
    print(f"\nall {len(ids)} requests ended {time.monotonic() - killed_at:.1f} s after the kill")
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
    for rid in ids:
        assert fleet.redis.hget(fleet.keys.request(rid), "worker") != node
        events = [fields["event"] for _, fields in fleet.redis.xrange(fleet.keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events[-1] == "succeeded", events
    wait_for(lambda: not fleet.redis.zcard(fleet.keys.inflight), 10, "every batch to leave flight")
