"""``shared.shards``: the shard layout of a fleet from its settings, and the routes to a shard (by model, by id)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fusefleet.up import worker_layout
from shared.settings import Settings
from shared.shards import HOME, ID_BYTES, MARK_DIGITS, Shards, ShardsError, shard_mark, spread

MODELS = "sd=demo:stable-diffusion,pixart=demo:pixart,sana=demo:sana"


def fleet(**values: object) -> Settings:
    return Settings(_env_file=None, models=MODELS, **values)  # type: ignore[call-arg]


def test_a_fleet_without_shards_is_one_shard_its_own_keys_and_random_ids() -> None:
    shards = Shards(fleet())
    assert shards.names == (HOME,) and not shards.sharded
    assert shards.models_of(HOME) == ("sd", "pixart", "sana")
    assert shards.settings_of(HOME) is shards.settings
    ids = {shards.new_request_id(HOME) for _ in range(200)}
    assert len({request_id[:MARK_DIGITS] for request_id in ids}) > 100, "all 128 bits stay random"
    assert all(len(request_id) == 2 * ID_BYTES for request_id in ids)
    assert all(shards.shard_of_request(request_id) == HOME for request_id in ids)


def test_models_go_to_their_shard_and_the_rest_stay_home() -> None:
    shards = Shards(fleet(model_shards="sd=images,pixart=images"))
    assert shards.names == (HOME, "images")
    assert shards.models_of("images") == ("sd", "pixart") and shards.models_of(HOME) == ("sana",)
    assert shards.shard_of_model("sd") == "images" and shards.shard_of_model("sana") == HOME
    every = Shards(fleet(model_shards={"sd": "a", "pixart": "b", "sana": "b"}))
    assert every.names == ("a", "b"), "no model is left home: the fleet's own keys hold no requests"


def test_a_shards_ids_carry_its_mark_and_route_back_to_it() -> None:
    shards = Shards(fleet(model_shards="sd=a,pixart=b"))
    for shard in shards.names:
        for _ in range(20):
            request_id = shards.new_request_id(shard)
            assert request_id.startswith(shard_mark(shard)) and len(request_id) == 2 * ID_BYTES
            int(request_id, 16)  # hex throughout
            assert shards.shard_of_request(request_id) == shard
    foreign = next(mark for mark in (f"{n:04x}" for n in range(65536)) if mark not in map(shard_mark, shards.names))
    assert shards.shard_of_request(foreign + "0" * 28) is None


def test_a_marks_are_stable_names_not_positions() -> None:
    assert shard_mark("images") == Shards(fleet(model_shards="sd=x,pixart=images")).new_request_id("images")[:4]
    assert shard_mark("a") != shard_mark("b") and len(shard_mark("a")) == MARK_DIGITS


def test_a_shards_settings_have_its_prefix_and_queue() -> None:
    shards = Shards(fleet(model_shards="sd=a", key_prefix="ff", queue_name="jobs"))
    inside = shards.settings_of("a")
    assert inside.key_prefix == "ff:a" and inside.queue_name == "jobs:a"
    assert inside.catalog == shards.settings.catalog and inside.model_shards == shards.settings.model_shards
    default_queue = Shards(fleet(model_shards="sd=a")).settings_of("a")
    assert default_queue.key_prefix == "fusefleet:a" and default_queue.queue_name == "fusefleet.batches:a"
    with pytest.raises(KeyError, match="no shard 'c'"):
        shards.settings_of("c")


def test_a_worker_serves_one_shards_models() -> None:
    assert Shards(fleet(model_shards="sd=a,pixart=a", worker_models="sd,pixart")).shard_of_worker() == "a"
    assert Shards(fleet(model_shards="sd=a", worker_models="sana")).shard_of_worker() == HOME
    with pytest.raises(ShardsError, match="span shards"):
        Shards(fleet(model_shards="sd=a")).shard_of_worker()  # every model: two shards
    with pytest.raises(ValidationError, match="worker_models span shards"):
        fleet(model_shards="sd=a", worker_models="sd,sana")


def test_bad_shard_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="model_shards names flux"):
        fleet(model_shards="flux=a")
    with pytest.raises(ValidationError, match="model_shards: 'a b' is not a shard name"):
        fleet(model_shards={"sd": "a b"})
    with pytest.raises(ValidationError, match="model_shards: 'sd' is not model=shard"):
        fleet(model_shards="sd")


# --- a model of several shards ---------------------------------------------------------------------------------------


def test_a_model_may_name_several_shards_in_the_environment_and_in_json() -> None:
    shards = Shards(fleet(model_shards="sd=sd-a|sd-b|sd-c,pixart=sd-a"))
    assert shards.shards_of_model("sd") == ("sd-a", "sd-b", "sd-c") and shards.shards_of_model("pixart") == ("sd-a",)
    assert shards.names == (HOME, "sd-a", "sd-b", "sd-c")
    assert shards.models_of("sd-a") == ("sd", "pixart") and shards.models_of("sd-b") == ("sd",)
    assert shards.models_of(HOME) == ("sana",) and shards.shards_of_model("sana") == (HOME,)
    assert shards.shard_of_model("pixart") == "sd-a", "a model of one shard: that one"
    with pytest.raises(ShardsError, match="'sd' is in shards 'sd-a', 'sd-b', 'sd-c'"):
        shards.shard_of_model("sd")
    same = fleet(model_shards='{"sd": ["sd-a", "sd-b", "sd-c"], "pixart": "sd-a"}').model_shards
    assert same == shards.settings.model_shards == {"sd": ("sd-a", "sd-b", "sd-c"), "pixart": ("sd-a",)}
    assert fleet(model_shards={"sd": ["x", "y"]}).model_shards == {"sd": ("x", "y")}


def test_spread_picks_by_the_token_evenly_over_the_shards() -> None:
    shards = ("a", "b", "c")
    counts = dict.fromkeys(shards, 0)
    for n in range(3000):
        counts[spread(shards, f"{n:032x}")] += 1
    assert counts == {"a": 1000, "b": 1000, "c": 1000}, "consecutive tokens: exactly even"
    assert spread(shards, "f" * 32) == spread(shards, "F" * 32), "a pure function of the token"
    assert spread(("only",), "0123") == "only"


def test_new_requests_of_a_model_of_several_shards_spread_evenly_and_route_back() -> None:
    shards = Shards(fleet(model_shards="sd=sd-a|sd-b|sd-c"))
    counts = dict.fromkeys(shards.shards_of_model("sd"), 0)
    for _ in range(6000):
        request_id = shards.new_request_id_of("sd")
        shard = shards.shard_of_request(request_id)
        assert shard in counts and len(request_id) == 2 * ID_BYTES
        counts[shard] += 1
    assert all(1700 < count < 2300 for count in counts.values()), counts  # 2000 each (sigma 37): 8 sigma off
    assert {shards.shard_of_request(shards.new_request_id_of("sana")) for _ in range(50)} == {HOME}


def test_a_worker_of_a_model_of_several_shards_serves_the_one_worker_shard_names() -> None:
    layout = "sd=sd-a|sd-b,pixart=sd-a"
    assert Shards(fleet(model_shards=layout, worker_models="sd", worker_shard="sd-b")).shard_of_worker() == "sd-b"
    both = fleet(model_shards=layout, worker_models="sd,pixart")
    assert Shards(both).shard_of_worker() == "sd-a", "sd and pixart share one shard: no worker_shard needed"
    with pytest.raises(ShardsError, match=r"in shards 'sd-a', 'sd-b'.*set worker_shard \(FUSEFLEET_WORKER_SHARD\)"):
        Shards(fleet(model_shards=layout, worker_models="sd")).shard_of_worker()
    with pytest.raises(ShardsError, match="worker_shard 'sd-b' is not a shard of all this worker's models"):
        Shards(fleet(model_shards=layout, worker_models="sd,pixart", worker_shard="sd-b")).shard_of_worker()
    with pytest.raises(ShardsError, match="worker_shard 'sd-a' is not a shard of all .*the fleet's own"):
        Shards(fleet(model_shards=layout, worker_models="sana", worker_shard="sd-a")).shard_of_worker()
    with pytest.raises(ShardsError, match="span shards"):
        Shards(fleet(model_shards=layout, worker_shard="sd-a")).shard_of_worker()  # every model: sana is home


def test_bad_shard_lists_and_worker_shards_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="model_shards: 'sd' names a shard twice"):
        fleet(model_shards="sd=a|a")
    with pytest.raises(ValidationError, match="model_shards: '' is not a shard name"):
        fleet(model_shards="sd=a|")
    with pytest.raises(ValidationError, match="worker_shard 'c' is not a shard of model_shards \\('a', 'b'\\)"):
        fleet(model_shards="sd=a|b", worker_shard="c")
    with pytest.raises(ValidationError, match="worker_shard 'a' is not a shard of model_shards \\(none\\)"):
        fleet(worker_shard="a")
    with pytest.raises(ValidationError, match="worker_models span shards 'a', 'b', 'c'"):
        fleet(model_shards="sd=a|b,pixart=c", worker_models="sd,pixart")  # no shard holds both
    assert fleet(model_shards="sd=a|b,pixart=b|a", worker_models="sd,pixart").common_shards == ("a", "b")


def test_up_starts_workers_in_each_shard_of_a_model_each_naming_its_shard() -> None:
    layout = "sd=sd-a|sd-b,pixart=sd-a"
    env = {"FUSEFLEET_MODELS": MODELS, "FUSEFLEET_MODEL_SHARDS": layout}
    workers = worker_layout(env, 1)
    assert workers == [("sana", HOME), ("sd,pixart", "sd-a"), ("sd", "sd-b")]
    for served, shard in (worker for worker in workers if worker is not None):
        settings = fleet(model_shards=layout, worker_models=served, worker_shard=shard)  # "" is unset
        assert Shards(settings).shard_of_worker() == shard
