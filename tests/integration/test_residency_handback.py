"""A worker multiplexing two models (``max_resident_models=1``) never thrashes: a model it loaded stays at least
``min_residency_s``, so a batch of the other model that comes sooner is handed back unclaimed (no attempt counted)
and placed again until the model may be evicted. Real processes (api, scheduler, one worker) with the placeholder
``ChaosRunner``; requests of both models alternate, and each load on demand starts at least ``MIN_RESIDENCY_S``
after the one before (the worker's own log lines).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest import Fleet, running_fleet
from tests.support.redis_server import RedisServer

MIN_RESIDENCY_S = 1.5
LOADING = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO gpu_worker\.residency: loading (\w+) ", re.M)


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    env = {
        "FUSEFLEET_RUNNER": "tests.support.runners:ChaosRunner",
        "FUSEFLEET_SIM_BASE_MS": "0",
        "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
        "FUSEFLEET_MODELS": "a=demo:stable-diffusion,b=demo:pixart",
        "FUSEFLEET_MAX_RESIDENT_MODELS": "1",
        "FUSEFLEET_MIN_RESIDENCY_S": str(MIN_RESIDENCY_S),
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    }
    logs = tmp_path_factory.mktemp("residency-handback-logs")
    with running_fleet(redis_server, model_cache, lora_dir, logs, workers=1, **env) as one:
        yield one


def test_alternating_models_load_no_sooner_than_the_minimum_residency(fleet: Fleet) -> None:
    order = ["a", "b", "a", "b"]  # the worker holds b after its start: a, b, a, b are loads on demand
    # one at a time, each as soon as the one before has ended (so within the minimum residency of its model's load):
    # submitted together, the scheduler would batch the two requests of a model together (its policy looks at one
    # model's requests at a time), and there would be fewer switches to watch
    ids, states = [], {}
    for i, model in enumerate(order):
        ids.append(fleet.submit(model=model, prompt=f"{model} {i}"))
        states |= fleet.wait_done(ids[-1:], timeout=60)
    assert [states[rid]["status"] for rid in ids] == ["succeeded"] * 4, states
    for rid in ids:
        assert fleet.redis.hget(fleet.keys.batch(states[rid]["batch_id"]), "attempts") == "1"  # hand-backs: none
    log = fleet.workers[0].log()
    assert "no room to load" in log and "handed back" in log
    loads = [(datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f"), model) for at, model in LOADING.findall(log)]
    assert [model for _, model in loads] == ["a", "b", "a", "b", "a", "b"]  # its start (a, then b kept), 4 switches
    on_demand = [at for at, _ in loads[1:]]  # from the load of the b it kept
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(on_demand, on_demand[1:], strict=False)]
    assert all(gap >= MIN_RESIDENCY_S - 0.05 for gap in gaps), gaps  # log times are wall clock to the ms
