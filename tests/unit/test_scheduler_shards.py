"""A sharded fleet's scheduler side: the spread of the shards' leases over the scheduler processes (``spread``, pure;
``ShardLeaders`` and ``LeaderLoop``'s ``wanted`` on fakeredis), a worker inside its models' shard
(``worker_settings``), ``fusefleet up``'s workers per shard (``worker_models``) and ``fusefleet status`` over shards
(``render_fleet``)."""

from __future__ import annotations

import math
import random
import threading
import time

import fakeredis
import pytest

from fusefleet.status import FleetStatus, ShardStatus, render, render_fleet
from fusefleet.up import worker_models
from gpu_worker.app import worker_settings
from scheduler.lease import LeaderLoop, Lease
from scheduler.shard_leaders import ShardLeaders, spread
from shared.fleet_state import FleetSnapshot
from shared.keys import RedisKeys
from shared.settings import Settings
from shared.shards import HOME, Shards, ShardsError

MODELS = "sd=demo:stable-diffusion,pixart=demo:pixart,sana=demo:sana,flux=demo:flux"
SHARDS = ("a", "b", "c", "d")


def fleet(**values: object) -> Settings:
    return Settings(_env_file=None, models=MODELS, **values)  # type: ignore[call-arg]


# --- the decision ---------------------------------------------------------------------------------------------------


def test_a_lone_process_leads_every_shard() -> None:
    assert spread("p1", ["p1"], {}, SHARDS) == set(SHARDS)
    assert spread("p1", [], {"a": "p1"}, SHARDS) == set(SHARDS), "itself counts as live, listed or not"
    assert spread("p1", ["p1"], {"a": "p1", "b": "p1", "c": "p1", "d": "p1"}, SHARDS) == set(SHARDS)


def test_a_process_above_its_share_hands_back_its_last_shard_one_at_a_time() -> None:
    every: dict[str, str | None] = dict.fromkeys(SHARDS, "p1")
    assert spread("p1", ["p1", "p2"], every, SHARDS) == {"a", "b", "c"}, "share 2: d goes back first"
    assert spread("p1", ["p1", "p2"], {**every, "d": "p2"}, SHARDS) == {"a", "b"}, "then c"
    assert spread("p1", ["p1", "p2"], {"a": "p1", "b": "p1", "c": "p2", "d": "p2"}, SHARDS) == {"a", "b"}


def test_a_process_short_of_its_share_contends_for_as_many_free_shards_as_it_has_room_for() -> None:
    holders = {"a": "p1", "b": "p1", "c": "p1"}
    assert spread("p2", ["p1", "p2"], holders, SHARDS) == {"d"}, "share 2: d is the one free shard"
    assert spread("p2", ["p1", "p2"], {"a": "p1"}, SHARDS) <= {"b", "c", "d"}
    assert len(spread("p2", ["p1", "p2"], {"a": "p1"}, SHARDS)) == 2
    assert spread("p2", ["p1", "p2"], {"a": "p1", "b": "p2"}, SHARDS) in ({"b", "c"}, {"b", "d"})
    at_share = {"a": "p1", "b": "p1", "c": "p2"}
    assert spread("p1", ["p1", "p2"], at_share, SHARDS) == {"a", "b"}, "at its share it contends for nothing"


def test_processes_short_of_their_share_go_for_different_free_shards() -> None:
    live = ["p1", "p2", "p3", "p4"]
    chosen = [spread(me, live, {}, SHARDS) for me in live]
    assert all(len(one) == 1 for one in chosen) and set().union(*chosen) == set(SHARDS)


def test_a_shard_held_by_a_process_gone_is_free_and_one_held_by_a_live_one_is_never_taken() -> None:
    assert spread("p1", ["p1"], {"a": "p1", "b": "gone", "c": "gone"}, ("a", "b", "c")) == {"a", "b", "c"}
    held = {"a": "p2", "b": "p2", "c": "p2"}
    assert spread("p1", ["p1", "p2"], held, ("a", "b", "c")) == set(), "p2 hands back; p1 takes only what is free"


def settle(
    processes: list[str], holders: dict[str, str | None], shards: tuple[str, ...], rng: random.Random, rounds: int = 30
) -> int:
    """Rounds of the whole fleet, the processes deciding in a random order on what they see (leases handed back at
    once, a free one taken by the first contender); the rounds until nothing changed, or -1 if it never settled."""
    for round_no in range(rounds):
        changed = False
        for me in rng.sample(processes, len(processes)):
            wanted = spread(me, processes, holders, shards)
            for shard in shards:
                if holders.get(shard) == me and shard not in wanted:
                    holders[shard], changed = None, True
                elif shard in wanted and holders.get(shard) not in processes:
                    holders[shard], changed = me, True
        if not changed:
            return round_no
    return -1


@pytest.mark.parametrize("seed", range(20))
def test_any_fleet_settles_with_every_shard_led_and_none_above_its_share(seed: int) -> None:
    rng = random.Random(seed)
    shards = tuple(f"s{i}" for i in range(rng.randint(1, 9)))
    processes = [f"p{i}" for i in range(rng.randint(1, 5))]
    holders: dict[str, str | None] = {shard: rng.choice([*processes, None]) for shard in shards}
    for _ in range(3):  # settle; a process dies (its leases lapse); another joins
        assert settle(processes, holders, shards, rng) >= 0
        share = math.ceil(len(shards) / len(processes))
        assert all(holders[shard] in processes for shard in shards), holders
        assert all(sum(h == p for h in holders.values()) <= share for p in processes), holders
        if len(processes) > 1:
            dead = processes.pop(rng.randrange(len(processes)))
            holders = {shard: None if held == dead else held for shard, held in holders.items()}
        processes.append(f"n{rng.randint(0, 10**6)}")


# --- the loop around it, on fakeredis ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_shard_leaders_announce_read_the_leases_and_count_a_silent_process_gone() -> None:
    server = fakeredis.FakeServer()
    settings = fleet(key_prefix="t", model_shards="sd=a,pixart=b,sana=c,flux=d", scheduler_lease_ms=3000)
    clock = Clock()
    one = ShardLeaders(fakeredis.FakeRedis(server=server, decode_responses=True), settings, token="p1", clock=clock)
    two = ShardLeaders(fakeredis.FakeRedis(server=server, decode_responses=True), settings, token="p2", clock=clock)
    assert one.round() == set(SHARDS), "alone: every shard"
    redis = fakeredis.FakeRedis(server=server, decode_responses=True)
    shards = Shards(settings)
    leases = {shard: RedisKeys(shards.settings_of(shard).key_prefix).scheduler_lease for shard in SHARDS}
    for shard in SHARDS:
        redis.set(leases[shard], "p1")
    assert two.round() == set(), "p1 holds all, at share 4 of its view yet: p2 waits"
    assert one.round() == {"a", "b", "c"} and one.wants("a") and not one.wants("d")
    redis.delete(leases["d"])  # handed back
    assert two.round() == {"d"}
    assert set(redis.zrange(RedisKeys("t").scheduler_processes, 0, -1)) == {"p1", "p2"}
    clock.now += 2.1  # past two thirds of the lease TTL: p1's announcement lapsed (p2's too, but it announces now)
    assert two.round() == set(SHARDS), "p1 counts as gone: its shards are free to contend for as its leases lapse"
    assert redis.zrange(RedisKeys("t").scheduler_processes, 0, -1) == ["p2"]


def test_a_loop_not_wanted_never_contends_and_a_lead_no_longer_wanted_hands_its_lease_back() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    wanted = threading.Event()
    stop = threading.Event()
    led = threading.Event()
    lease = Lease(client, "t:lease", 300, token="p1")
    loop: LeaderLoop

    def lead(stop: threading.Event) -> None:
        led.set()
        renewal = loop.renewal()
        while not stop.is_set():
            now = time.monotonic()
            if renewal.due(now) and not renewal.renew(now):
                return
            stop.wait(0.01)

    loop = LeaderLoop(lease, lead, name="test", wanted=wanted.is_set)
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        time.sleep(0.3)
        assert client.get("t:lease") is None and not led.is_set(), "not wanted: it never took the lease"
        wanted.set()
        assert led.wait(2) and client.get("t:lease") == "p1"
        wanted.clear()
        deadline = time.monotonic() + 2
        while client.get("t:lease") is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.get("t:lease") is None, "handed back (released) at its next renewal, not left to lapse"
        other = Lease(client, "t:lease", 5000)
        assert other.try_acquire()
        time.sleep(0.3)
        assert client.get("t:lease") == other.token
    finally:
        stop.set()
        thread.join(5)


# --- the worker -------------------------------------------------------------------------------------------------------


def test_a_worker_runs_inside_its_models_shard() -> None:
    settings = fleet(key_prefix="ff", queue_name="jobs", model_shards="sd=a,pixart=a,sana=b", worker_models="sd,pixart")
    inside = worker_settings(settings)
    assert inside.key_prefix == "ff:a" and inside.queue_name == "jobs:a" and inside.served_models == ("sd", "pixart")
    home = worker_settings(fleet(key_prefix="ff", model_shards="sd=a", worker_models="flux"))
    assert home.key_prefix == "ff", "a model no shard names stays in the fleet's own keys"
    plain = fleet(key_prefix="ff")
    assert worker_settings(plain) is plain, "a fleet without shards: its own settings, unchanged"


def test_a_worker_whose_models_span_shards_refuses_to_start_saying_which_and_how_to_fix_it() -> None:
    with pytest.raises(ShardsError) as refused:
        worker_settings(fleet(model_shards="sd=a,pixart=b"))  # no worker_models: every model, in three shards
    message = str(refused.value)
    assert "'a'" in message and "'b'" in message and "the fleet's own" in message and "worker_models" in message


def test_up_starts_its_workers_per_shard_each_serving_the_shards_models() -> None:
    assert worker_models({"FUSEFLEET_MODELS": MODELS}, 2) == [None, None], "no shards: as configured"
    sharded = {"FUSEFLEET_MODELS": MODELS, "FUSEFLEET_MODEL_SHARDS": "sd=a,pixart=a,flux=b"}
    assert worker_models(sharded, 1) == ["sana", "sd,pixart", "flux"], "the fleet's own shard first"
    assert worker_models(sharded, 2) == ["sana", "sana", "sd,pixart", "sd,pixart", "flux", "flux"]
    assert worker_models({**sharded, "FUSEFLEET_WORKER_MODELS": "flux"}, 2) == [None, None], "its own choice"


# --- fusefleet status -------------------------------------------------------------------------------------------------


def snapshot(queue: int, in_flight: int) -> FleetStatus:
    return FleetStatus(FleetSnapshot(queue_depth=queue, oldest_waiting_s=1.5, batches_in_flight=in_flight))


def test_status_of_a_sharded_fleet_sums_the_shards_and_lists_each_with_its_models() -> None:
    one = [ShardStatus(HOME, ("sd",), snapshot(3, 1))]
    assert render_fleet(one) == render(one[0].status), "one shard: as before"
    text = render_fleet([ShardStatus(HOME, ("sd",), snapshot(3, 1)), ShardStatus("fast", ("sana",), snapshot(2, 4))])
    assert text.splitlines()[0].startswith("fleet: 2 shards, 5 waiting, 5 batches in flight on 0 live workers")
    assert "shard the fleet's own (models: sd):\n  queue: 3 waiting" in text
    assert "shard 'fast' (models: sana):\n  queue: 2 waiting" in text and "  workers (0):" in text
