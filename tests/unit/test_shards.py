"""``shared.shards``: the shard layout of a fleet from its settings, and the routes to a shard (by model, by id)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import Settings
from shared.shards import HOME, ID_BYTES, MARK_DIGITS, Shards, ShardsError, shard_mark

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
