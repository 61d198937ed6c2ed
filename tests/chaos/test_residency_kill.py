"""A worker that multiplexes two models (``max_resident_models=1``) is SIGKILLed in the middle of loading a model
on demand, and, in another fleet, in the middle of a forward of a model it just loaded: every request succeeds,
exactly once, on the worker that replaces it.

A kill during a load costs no attempt: the worker loads before it claims, so the batch was never claimed and the
reaper publishes it again once its claim timeout passes (``FUSEFLEET_BATCH_CLAIM_TIMEOUT_S``). A kill during a
forward is a lost run like any other: the lock lapses (``FUSEFLEET_BATCH_LOCK_TTL_S``) and the batch runs again.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.fleet import Fleet
from tests.support.processes import Service, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

MODELS = "a=demo:stable-diffusion,b=demo:pixart"
MUX_ENV = {"FUSEFLEET_MAX_RESIDENT_MODELS": "1", "FUSEFLEET_MIN_RESIDENCY_S": "0"}


def multiplexing_fleet(chaos_redis: RedisFactory, chaos_fleet: FleetFactory, **env: str) -> tuple[Fleet, Service]:
    """A fleet of models a and b with one worker serving both, holding one: it warms a then b, and keeps b."""
    fleet = chaos_fleet(
        chaos_redis(), workers=0, FUSEFLEET_MODELS=MODELS, FUSEFLEET_RUNNER="tests.support.residency:SlowReloadRunner"
    )
    mux = fleet.add_worker("mux", **MUX_ENV, **env)
    return fleet, mux


def assert_all_succeeded_once(fleet: Fleet, ids: list[str], *, after: list[str], killed: str) -> None:
    """Every request of ``ids`` succeeded exactly once; those of ``after`` (unfinished at the kill) elsewhere."""
    states = fleet.wait_done(ids, timeout=60)
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
    for rid in ids:
        events = [fields["event"] for _, fields in fleet.redis.xrange(fleet.keys.request_events(rid))]
        assert events.count("succeeded") == 1 and events[-1] == "succeeded", events
    assert all(states[rid]["worker"] != killed for rid in after), states
    wait_for(lambda: not fleet.redis.zcard(fleet.keys.inflight), 10, "every batch to leave flight")


def test_a_worker_killed_while_loading_a_model_loses_nothing_and_costs_no_attempt(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    fleet, mux = multiplexing_fleet(chaos_redis, chaos_fleet)
    killed = mux.env["FUSEFLEET_WORKER_NAME"]
    warm = fleet.submit(model="b", prompt="b is resident")
    assert fleet.wait_done([warm])[warm]["status"] == "succeeded"
    loading = fleet.submit(model="a", prompt="needs a loaded")
    wait_for(lambda: mux.log().count("loading a") == 2, 10, "the worker to load a on demand")  # once at start
    mux.kill()
    killed_at = time.monotonic()
    fleet.add_worker("replacement", **MUX_ENV)
    after = [loading, fleet.submit(model="b", prompt="b after"), fleet.submit(model="a", prompt="a after")]
    assert_all_succeeded_once(fleet, [warm, *after], after=after, killed=killed)
    print(f"\nevery request ended {time.monotonic() - killed_at:.1f} s after the kill")
    batch = fleet.keys.batch(fleet.get(loading)["batch_id"])
    assert fleet.redis.hget(batch, "attempts") == "1"  # only the replacement's run: the load claimed nothing


def test_a_worker_killed_during_a_forward_of_a_model_it_loaded_loses_nothing(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory
) -> None:
    fleet, mux = multiplexing_fleet(chaos_redis, chaos_fleet, FUSEFLEET_SIM_BASE_MS="2000")
    killed = mux.env["FUSEFLEET_WORKER_NAME"]
    running = fleet.submit(model="a", prompt="runs after a load")  # the worker holds b: it loads a, then runs
    beside = fleet.submit(model="b", prompt="waits beside")
    state = fleet.wait_running(running, min_step=1, timeout=20)
    assert state["worker"] == killed
    mux.kill()
    killed_at = time.monotonic()
    fleet.add_worker("replacement", **MUX_ENV)
    assert_all_succeeded_once(fleet, [running, beside], after=[running, beside], killed=killed)
    print(f"\nevery request ended {time.monotonic() - killed_at:.1f} s after the kill")
