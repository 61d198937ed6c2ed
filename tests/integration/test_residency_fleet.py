"""Residency and multiplexing with real processes: a fleet of two models (two tiny families, the real diffusers
runner) and three workers, one per model and one multiplexing both with ``max_resident_models=1``.

Interleaved requests of both models through the native API and the official ``openai`` client all succeed and
equal their model's solo runs (within 1/255); each ran on a worker that serves its model (a worker of one model
never runs the other), and the model the multiplexing worker does not hold ran on its own worker, placed there
through that worker's own queue; ``GET /v1/models`` lists both, resident. Then the worker of one model leaves:
that model's batches go to the multiplexing worker, which loads it on demand (evicting the other: a load and an
eviction in the metrics) and still runs each request on its own model's pipeline, with no attempt lost to a
hand-back.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from shared.contracts import WorkerCapabilities
from shared.metrics import parse_counters
from shared.settings import Settings
from tests.integration.conftest import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.solo import png_array, solo_image

FAMILIES = {"sd": "stable-diffusion", "px": "pixart"}
MODELS = ",".join(f"{name}=demo:{family}" for name, family in FAMILIES.items())
ONE_MODEL_WORKERS = {"sd": "sd-only", "px": "px-only"}
MUX = "mux"


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    for family in FAMILIES.values():
        ensure_demo_model(model_cache, family)  # built once, before the workers load them
    logs = tmp_path_factory.mktemp("residency-fleet-logs")
    env = {
        "FUSEFLEET_RUNNER": "gpu_worker.diffusers_runner:DiffusersRunner",
        "FUSEFLEET_MODELS": MODELS,
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "50",
    }
    with running_fleet(redis_server, model_cache, lora_dir, logs, workers=0, **env) as one:
        started = [one.new_worker(name, FUSEFLEET_WORKER_MODELS=model) for model, name in ONE_MODEL_WORKERS.items()]
        started.append(one.new_worker(MUX, FUSEFLEET_MAX_RESIDENT_MODELS="1", FUSEFLEET_MIN_RESIDENCY_S="0"))
        for worker in started:  # all at once: they load side by side
            one.workers.append(worker.start())
        names = [worker.env["FUSEFLEET_WORKER_NAME"] for worker in started]
        wait_for(lambda: all(one.redis.zscore(one.keys.workers, n) is not None for n in names), 120, "workers to beat")
        yield one


@pytest.fixture(scope="module")
def solo(model_cache: Path) -> dict[str, DiffusersRunner]:
    """Each model's runner in this process: what a request of it gives alone."""
    return {
        model: DiffusersRunner(Settings(model_cache_dir=model_cache, demo_family=family))
        for model, family in FAMILIES.items()
    }


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="unused", max_retries=0, timeout=180) as one:
        yield one


def node(fleet: Fleet, name: str) -> str:
    return f"{name}@{fleet.prefix}"


def servers(fleet: Fleet, model: str) -> set[str]:
    """The workers that serve ``model``: its own and the multiplexing one."""
    return {node(fleet, ONE_MODEL_WORKERS[model]), node(fleet, MUX)}


def announced(fleet: Fleet, name: str) -> WorkerCapabilities:
    return WorkerCapabilities.model_validate_json(fleet.redis.hget(fleet.keys.capabilities, node(fleet, name)) or "")


def b64_array(data: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"), dtype=np.int16)


def run_interleaved(
    fleet: Fleet, client: openai.OpenAI, solo: dict[str, DiffusersRunner], order: list[str], seed: int
) -> dict[str, dict[str, object]]:
    """Submit ``order`` natively (one batch call) and three requests through the openai client, interleaved; check
    that each succeeded and equals its model's solo run; the states by request id."""
    bodies = [
        {"prompt": f"a fox {i}", "model": model, "width": 64, "height": 64, "num_inference_steps": 4, "seed": seed + i}
        for i, model in enumerate(order)
    ]
    openai_models = ["px", "sd", "px"]
    with ThreadPoolExecutor(3) as pool:
        calls = [
            pool.submit(
                client.images.with_raw_response.generate,
                prompt=f"a heron {i}",
                model=model,
                size="64x64",
                extra_body={"seed": seed + 50 + i, "num_inference_steps": 4},
            )
            for i, model in enumerate(openai_models)
        ]
        ids = fleet.submit_batch(bodies)
        answers = [call.result() for call in calls]
    states = fleet.wait_done(ids)
    for rid in ids:
        state = states[rid]
        model = state["params"]["model"]
        assert state["status"] == "succeeded", state
        assert np.abs(png_array(fleet.image(rid)) - solo_image(solo[model], state)).max() <= 1, f"{rid} != solo"
    for answer, model in zip(answers, openai_models, strict=True):
        rid = answer.headers["x-request-id"]
        state = states[rid] = fleet.get(rid)
        assert (state["status"], state["params"]["model"]) == ("succeeded", model), state
        [image] = answer.parse().data or []
        assert np.abs(b64_array(image.b64_json or "") - solo_image(solo[model], state)).max() <= 1
    for rid, state in states.items():
        model = state["params"]["model"]
        assert state["worker"] in servers(fleet, model), f"{rid} of {model} ran on {state['worker']}"
        assert fleet.redis.hget(fleet.keys.batch(state["batch_id"]), "attempts") == "1"  # a hand-back counts none
    return states


def test_models_lists_both_and_the_multiplexing_worker_holds_one(fleet: Fleet, client: openai.OpenAI) -> None:
    listed = fleet.http.get("/v1/models").json()["data"]
    assert [(m["id"], m["family"], m["workers"], m["resident"]) for m in listed] == [
        ("sd", "stable-diffusion", 2, True),
        ("px", "pixart", 2, True),
    ]
    assert [model.id for model in client.models.list()] == ["sd", "px"]
    mux = announced(fleet, MUX)
    assert [(m.model, m.resident) for m in mux.served] == [("sd", False), ("px", True)]  # warmed in order, kept last
    assert all(m.load_s is not None and m.load_s > 0 for m in mux.served)  # each load measured at start
    for model, name in ONE_MODEL_WORKERS.items():
        assert [(m.model, m.resident) for m in announced(fleet, name).served] == [(model, True)]


def test_interleaved_requests_of_both_models_equal_their_solo_runs(
    fleet: Fleet, client: openai.OpenAI, solo: dict[str, DiffusersRunner]
) -> None:
    states = run_interleaved(fleet, client, solo, ["sd", "px", "px", "sd", "px", "sd"], seed=10)
    sd_only = node(fleet, ONE_MODEL_WORKERS["sd"])
    assert {state["worker"] for state in states.values() if state["params"]["model"] == "sd"} == {sd_only}
    # the multiplexing worker holds px, not sd: sd's batches were placed on sd's own worker, through its own queue
    assert f"requests on {sd_only}" in fleet.scheduler.log()


def test_without_its_own_worker_a_model_is_loaded_on_demand_by_the_multiplexing_worker(
    fleet: Fleet, client: openai.OpenAI, solo: dict[str, DiffusersRunner]
) -> None:
    before = parse_counters(fleet.redis.hgetall(fleet.keys.metrics))
    fleet.worker_named(node(fleet, ONE_MODEL_WORKERS["sd"])).stop()
    wait_for(
        lambda: fleet.redis.zscore(fleet.keys.workers, node(fleet, ONE_MODEL_WORKERS["sd"])) is None,
        10,
        "the sd worker to leave",
    )
    states = run_interleaved(fleet, client, solo, ["sd", "px", "sd", "px"], seed=100)
    sd_runs = {state["worker"] for state in states.values() if state["params"]["model"] == "sd"}
    assert sd_runs == {node(fleet, MUX)}
    after = parse_counters(fleet.redis.hgetall(fleet.keys.metrics))
    loads = after.model_loads["sd"][0] - before.model_loads.get("sd", (0, 0.0))[0]
    assert loads >= 1 and after.model_evictions.get("px", 0) > before.model_evictions.get("px", 0)
    assert "loaded sd in" in fleet.worker_named(node(fleet, MUX)).log()
    metrics = fleet.http.get("/metrics").text
    assert 'fusefleet_model_load_seconds_count{model="sd"}' in metrics
    assert 'fusefleet_model_evictions_total{model="px"}' in metrics
