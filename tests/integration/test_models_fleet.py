"""Many models, one fleet: real processes (api, scheduler and one worker per model, the real diffusers runner on
two tiny families), requests for both models interleaved through the native API and the official ``openai`` client.

Every image equals its model's solo run (within 1/255); each request ran on the worker of its model, and no worker
announces or runs a model it was not given; ``GET /v1/models`` lists both; an unknown model is refused (422 naming
``model`` natively, 404 ``model_not_found`` on the OpenAI surface). Last, a worker whose configuration routes the
default model's queue to it (another default model: a rolling change) fences the batches of the model it does not
serve that reach it there: they are handed back and run nothing, no attempt counted; and a worker of both
models (each loaded at start) runs each request on its own model's pipeline.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from shared.celery_config import RUN_BATCH_TASK, make_celery
from shared.contracts import BatchMessage, WorkerCapabilities
from shared.routing import model_queue
from shared.settings import Settings
from tests.integration.conftest import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.solo import png_array, solo_image

FAMILIES = {"sd": "stable-diffusion", "px": "pixart"}
MODELS = ",".join(f"{name}=demo:{family}" for name, family in FAMILIES.items())
WORKERS = {"sd": "sd-worker", "px": "px-worker"}


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    for family in FAMILIES.values():
        ensure_demo_model(model_cache, family)  # built once, before the workers load them
    logs = tmp_path_factory.mktemp("models-fleet-logs")
    env = {
        "FUSEFLEET_RUNNER": "gpu_worker.diffusers_runner:DiffusersRunner",
        "FUSEFLEET_MODELS": MODELS,
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "100",
    }
    with running_fleet(redis_server, model_cache, lora_dir, logs, workers=0, **env) as one:
        for model, name in WORKERS.items():
            one.add_worker(name, FUSEFLEET_WORKER_MODELS=model)
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


def node(fleet: Fleet, model: str) -> str:
    return fleet.worker_named(f"{WORKERS[model]}@{fleet.prefix}").env["FUSEFLEET_WORKER_NAME"]


def b64_array(data: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"), dtype=np.int16)


def test_models_lists_both_with_their_family(fleet: Fleet, client: openai.OpenAI) -> None:
    listed = fleet.http.get("/v1/models").json()["data"]
    assert [(m["id"], m["family"], m["workers"], m["resident"]) for m in listed] == [
        ("sd", "stable-diffusion", 1, True),
        ("px", "pixart", 1, True),
    ]
    assert [model.id for model in client.models.list()] == ["sd", "px"]


def test_each_worker_announces_only_its_model(fleet: Fleet) -> None:
    for model in FAMILIES:
        announced = fleet.redis.hget(fleet.keys.capabilities, node(fleet, model))
        assert announced is not None
        caps = WorkerCapabilities.model_validate_json(announced)
        assert [served.model for served in caps.served] == [model]


def test_interleaved_requests_of_both_models_equal_their_solo_runs(
    fleet: Fleet, client: openai.OpenAI, solo: dict[str, DiffusersRunner]
) -> None:
    order = ["sd", "px", "px", "sd", "px", "sd"]
    bodies = [
        {"prompt": f"a fox {i}", "model": model, "width": 64, "height": 64, "num_inference_steps": 4, "seed": 10 + i}
        for i, model in enumerate(order)
    ]
    with ThreadPoolExecutor(4) as pool:
        calls = [
            pool.submit(
                client.images.with_raw_response.generate,
                prompt=f"a heron {i}",
                model=model,
                size="64x64",
                extra_body={"seed": 40 + i, "num_inference_steps": 4},
            )
            for i, model in enumerate(["px", "sd", "px"])
        ]
        ids = fleet.submit_batch(bodies) + [fleet.submit(**body) for body in bodies[:2]]
        answers = [call.result() for call in calls]
    states = fleet.wait_done(ids)
    for rid in ids:
        state = states[rid]
        model = state["params"]["model"]
        assert state["status"] == "succeeded", state
        assert state["worker"] == node(fleet, model), f"{rid} of {model} ran on {state['worker']}"
        assert np.abs(png_array(fleet.image(rid)) - solo_image(solo[model], state)).max() <= 1, f"{rid} != solo"
    assert [states[rid]["params"]["model"] for rid in ids] == order + order[:2]
    for answer, model in zip(answers, ["px", "sd", "px"], strict=True):
        state = fleet.get(answer.headers["x-request-id"])
        assert (state["status"], state["params"]["model"], state["worker"]) == ("succeeded", model, node(fleet, model))
        [image] = answer.parse().data or []
        assert np.abs(b64_array(image.b64_json or "") - solo_image(solo[model], state)).max() <= 1


def test_each_model_is_checked_against_its_own_traits(fleet: Fleet) -> None:
    odd = {"prompt": "a fox", "width": 72, "height": 72, "num_inference_steps": 2}  # pixart takes multiples of 16
    accepted = fleet.http.post("/v1/requests", json={**odd, "model": "sd"})
    refused = fleet.http.post("/v1/requests", json={**odd, "model": "px"})
    assert accepted.status_code == 202 and refused.status_code == 422
    assert {tuple(e["loc"]) for e in refused.json()["detail"]} == {("body", "width"), ("body", "height")}
    assert fleet.wait_done([accepted.json()["id"]])[accepted.json()["id"]]["status"] == "succeeded"


def test_an_unknown_model_is_refused_on_both_surfaces(fleet: Fleet, client: openai.OpenAI) -> None:
    native = fleet.http.post("/v1/requests", json={"prompt": "a fox", "model": "dall-e-3"})
    assert native.status_code == 422
    [error] = native.json()["detail"]
    assert (error["type"], error["loc"]) == ("model_unknown", ["body", "model"])
    with pytest.raises(openai.NotFoundError) as missing:
        client.images.generate(prompt="a fox", model="dall-e-3")
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")


def test_a_worker_routed_another_models_batches_fences_them(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    # this worker takes the default model's queue for px (its default), so sd batches that go there reach it: the
    # scheduler places each batch on a worker of its model, so only copies of a delivery (a broker's redelivery, a
    # batch published again while no worker of its model was free) do
    rogue = fleet.add_worker("rogue", FUSEFLEET_WORKER_MODELS="px", FUSEFLEET_DEFAULT_MODEL="px")
    sides = [64, 80, 96, 112]  # one batch each
    ids = [fleet.submit(model="sd", width=side, height=side, seed=side) for side in sides]
    states = fleet.wait_done(ids, timeout=180)
    for rid in ids:
        assert states[rid]["status"] == "succeeded", states[rid]
        assert states[rid]["worker"] == node(fleet, "sd")
        batch = fleet.keys.batch(states[rid]["batch_id"])
        assert fleet.redis.hget(batch, "attempts") == "1"  # the one run that ran it
    for name, value in fleet.env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    celery = make_celery(settings)
    fenced = "handed back: its model sd is not served here"
    # batches delivered again on sd's queue, which the sd worker and the rogue one both read: copies until the rogue
    # worker has taken (and fenced) one; either worker may take any copy, so at most 40 (each ~1/2: never all 40)
    for copy in range(40):
        rid = ids[copy % len(ids)]
        message = BatchMessage(batch_id=states[rid]["batch_id"], request_ids=(rid,), created_at=time.time(), model="sd")
        celery.send_task(
            RUN_BATCH_TASK,
            args=[message.model_dump(mode="json")],
            queue=model_queue(settings, "sd"),
            task_id=f"{rid}-{copy}",
        )
        settled = time.monotonic() + 1.0
        while fenced not in rogue.log() and time.monotonic() < settled:
            time.sleep(0.05)
        if fenced in rogue.log():
            break
    wait_for(lambda: fenced in rogue.log(), 10, "the rogue worker to fence")
    for rid in ids:  # the copies ran nothing again
        assert fleet.redis.hget(fleet.keys.batch(states[rid]["batch_id"]), "attempts") == "1"
        assert fleet.redis.hget(fleet.keys.request(rid), "status") == "succeeded"
    rogue.stop()


def test_a_worker_of_both_models_runs_each_on_its_own_pipeline(fleet: Fleet, solo: dict[str, DiffusersRunner]) -> None:
    for model in FAMILIES:  # the one-model workers leave: only the worker of every model (the default) is left
        fleet.worker_named(node(fleet, model)).stop()
    both = fleet.add_worker("both")
    caps = WorkerCapabilities.model_validate_json(fleet.redis.hget(fleet.keys.capabilities, f"both@{fleet.prefix}"))
    assert [(served.model, served.traits.family) for served in caps.served] == list(FAMILIES.items())
    ids = [fleet.submit(model=model, seed=70 + i) for i, model in enumerate(["px", "sd", "px", "sd"])]
    states = fleet.wait_done(ids)
    for rid in ids:
        state = states[rid]
        assert (state["status"], state["worker"]) == ("succeeded", both.env["FUSEFLEET_WORKER_NAME"]), state
        model = state["params"]["model"]
        assert np.abs(png_array(fleet.image(rid)) - solo_image(solo[model], state)).max() <= 1, f"{rid} != solo"
