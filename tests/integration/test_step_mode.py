"""Step mode end to end (``FUSEFLEET_STEP_MODE=1``, docs/step_mode.md): real api, scheduler and worker processes on
the tiny demo model. Requests with other step counts and guidance scales join a running set at a step boundary and
leave it when done; each one's image equals its solo run within 1/255; an aborted row leaves and its peer goes on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages
from shared.contracts import LoraRef, RequestSpec, Task, WorkerCapabilities
from tests.integration.conftest import LORA_NAME, Fleet, running_fleet
from tests.integration.test_image_tasks import encoded, picture
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.solo import no_stop, png_array, solo_image

LONG_STEPS = 400  # long enough for the others to join while it runs (the demo model takes ~10 ms a step)
ABORTED_STEPS = 900  # a long request aborted at the end, outlasting its joiners and their solo runs (DDIM: < 1000)


@pytest.fixture(scope="module")
def step_fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    log_dir = tmp_path_factory.mktemp("step-fleet-logs")
    env = {"FUSEFLEET_STEP_MODE": "1", "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0"}
    with running_fleet(redis_server, model_cache, lora_dir, log_dir, **env) as fleet:
        yield fleet


def _hash(fleet: Fleet, request_id: str) -> dict[str, Any]:
    return dict(fleet.redis.hgetall(fleet.keys.request(request_id)))


def test_requests_with_other_steps_and_guidance_join_a_running_set(
    step_fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    fleet = step_fleet
    long = fleet.submit(prompt="the long one", num_inference_steps=LONG_STEPS)
    fleet.wait_running(long, min_step=2)
    joiners = [
        fleet.submit(prompt="a cat", num_inference_steps=3, guidance_scale=1.0, seed=5),
        fleet.submit(prompt="a dog", num_inference_steps=5, guidance_scale=5.0, seed=6),
        fleet.submit(prompt="two owls", num_inference_steps=4, guidance_scale=7.5, n=2, seed=7),
    ]
    states = fleet.wait_done(joiners, timeout=60)
    assert {s["status"] for s in states.values()} == {"succeeded"}, states
    # they finished while the long request still ran: they joined its set instead of waiting for it
    assert fleet.get(long)["status"] == "running", "the joiners waited for the long request instead of joining it"
    workers = {_hash(fleet, rid)["worker"] for rid in [long, *joiners]}
    assert len(workers) == 1, workers
    for rid, state in states.items():
        total = state["params"]["num_inference_steps"]
        assert state["progress"] == {"step": total, "total": total}, state["progress"]
        for k in range(state["params"]["n"]):
            solo = solo_image(solo_runner, {**state, "seed": state["seed"] + k})
            assert np.abs(png_array(fleet.image(rid, k)) - solo).max() <= 1, f"{rid}/{k} differs from its solo run"
    assert fleet.wait_done([long], timeout=120)[long]["status"] == "succeeded"


def test_requests_of_other_lora_adapters_join_one_running_set(step_fleet: Fleet, solo_runner: DiffusersRunner) -> None:
    """The adapter is a row's own, not the step key's: joiners with the LoRA and without it join a set opened by a
    request without one, and each equals its solo run with its own adapter (that adapters change a row is
    tests/unit/test_step_engine_image_tasks.py's)."""
    fleet = step_fleet
    long = fleet.submit(prompt="the long one", num_inference_steps=ABORTED_STEPS, seed=30)
    fleet.wait_running(long, min_step=2)
    adapters = {"lora": LoraRef(name=LORA_NAME, scale=0.8), "none": None}
    joiners = {
        name: fleet.submit(
            prompt=f"a lantern, {name}",
            num_inference_steps=3 + k,
            seed=31 + k,
            **({"lora": lora.model_dump()} if lora is not None else {}),
        )
        for k, (name, lora) in enumerate(adapters.items())
    }
    states = fleet.wait_done(list(joiners.values()), timeout=60)
    assert {s["status"] for s in states.values()} == {"succeeded"}, states
    assert fleet.get(long)["status"] == "running", "the joiners waited for the long request instead of joining it"
    assert len({_hash(fleet, rid)["worker"] for rid in [long, *joiners.values()]}) == 1
    for name, rid in joiners.items():
        solo = solo_image(solo_runner, states[rid], lora=adapters[name])
        assert np.abs(png_array(fleet.image(rid)) - solo).max() <= 1, f"{name} differs from its solo run"
    fleet.http.post(f"/v1/requests/{long}/abort")
    assert fleet.wait_done([long], timeout=30)[long]["status"] == "aborted"


def test_text_and_image_requests_of_two_strengths_join_one_running_set(
    step_fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    """The demo model's step rows carry their task and strength (``ModelTraits.step_tasks``, announced): a
    text-to-image request and image-to-image requests of other steps, guidance, LoRA and strengths (0.6, 0.4) join
    one set opened by a long text-to-image one; each image-to-image row starts at its strength's step from its own
    input image, and each request equals its own solo run (the pipeline's call, request-level) within 1/255."""
    fleet = step_fleet
    long = fleet.submit(prompt="the long one", num_inference_steps=ABORTED_STEPS, seed=40)
    fleet.wait_running(long, min_step=2)
    text = fleet.submit(prompt="a lighthouse", num_inference_steps=4, guidance_scale=6.0, seed=43)
    lora = LoraRef(name=LORA_NAME, scale=0.8)
    bodies = [
        {"prompt": "a harbour", "num_inference_steps": 5, "guidance_scale": 1.0, "seed": 41, "strength": 0.6},
        {"prompt": "a forest", "num_inference_steps": 8, "guidance_scale": 6.0, "seed": 42, "strength": 0.4,
         "lora": lora.model_dump()},
    ]  # fmt: skip
    images = [fleet.submit(**body, image=encoded(picture(41 + k))) for k, body in enumerate(bodies)]
    joiners = [text, *images]
    states = fleet.wait_done(joiners, timeout=60)
    assert {s["status"] for s in states.values()} == {"succeeded"}, states
    assert fleet.get(long)["status"] == "running", "the joiners waited for the long request instead of joining it"
    workers = {fleet.redis.hget(fleet.keys.request(rid), "worker") for rid in [long, *joiners]}  # (binary inputs)
    assert len(workers) == 1, workers
    assert np.abs(png_array(fleet.image(text)) - solo_image(solo_runner, states[text])).max() <= 1, "text differs"
    for k, (rid, body) in enumerate(zip(images, bodies, strict=True)):
        params, strength = states[rid]["params"], float(str(body["strength"]))
        assert params["task"] == Task.IMAGE_TO_IMAGE and params["strength"] == strength
        assert states[rid]["progress"]["total"] == int(params["num_inference_steps"] * strength), "strength's steps"
        spec = RequestSpec(
            id="solo",
            model="demo",
            prompt=params["prompt"],
            seed=states[rid]["seed"],
            num_inference_steps=params["num_inference_steps"],
            guidance_scale=params["guidance_scale"],
            task=Task.IMAGE_TO_IMAGE,
            strength=strength,
            lora=lora if k == 1 else None,
            created_at=0.0,
        )
        ((solo,),) = solo_runner.run([spec], no_stop, inputs={"solo": InputImages(picture(41 + k))})
        solo_pixels = np.asarray(solo, dtype=np.int16)
        assert np.abs(png_array(fleet.image(rid)) - solo_pixels).max() <= 1, f"{rid} differs from its solo run"
    fleet.http.post(f"/v1/requests/{long}/abort")
    assert fleet.wait_done([long], timeout=30)[long]["status"] == "aborted"


def test_an_aborted_row_leaves_the_set_and_its_peer_goes_on(step_fleet: Fleet, solo_runner: DiffusersRunner) -> None:
    fleet = step_fleet
    peer = fleet.submit(prompt="the peer", num_inference_steps=60, seed=11)
    fleet.wait_running(peer, min_step=1)
    victim = fleet.submit(prompt="the victim", num_inference_steps=LONG_STEPS, seed=12)
    fleet.wait_running(victim, min_step=2)
    answer = fleet.http.post(f"/v1/requests/{victim}/abort")
    assert answer.status_code == 200, answer.text
    victim_state = fleet.wait_done([victim], timeout=15)[victim]
    assert victim_state["status"] == "aborted"
    assert victim_state["progress"]["step"] < LONG_STEPS
    assert fleet.http.get(f"/v1/requests/{victim}/images/0").status_code == 404
    state = fleet.wait_done([peer], timeout=60)[peer]
    assert state["status"] == "succeeded"
    assert np.abs(png_array(fleet.image(peer)) - solo_image(solo_runner, state)).max() <= 1


def test_the_set_closes_and_frees_the_worker_when_empty(step_fleet: Fleet) -> None:
    fleet = step_fleet
    rid = fleet.submit(prompt="alone", num_inference_steps=3)
    assert fleet.wait_done([rid])[rid]["status"] == "succeeded"
    keys = fleet.keys

    def closed() -> bool:
        return not fleet.redis.hlen(keys.step_sets) and not fleet.redis.zcard(keys.inflight)

    wait_for(closed, 10, "the running set to close and its batches to leave flight")


def test_more_steps_than_the_demo_scheduler_runs_are_refused_up_front(step_fleet: Fleet) -> None:
    """DDIM of a 1000-step schedule, leading spacing, offset 1: 1000 steps index past its end (an IndexError on the
    worker, in step mode and request-level alike); its worker announces 999, so the api refuses 1000 with a 422."""
    [announced] = step_fleet.redis.hvals(step_fleet.keys.capabilities)
    assert WorkerCapabilities.model_validate_json(announced).served[0].traits.max_inference_steps == 999
    response = step_fleet.http.post("/v1/requests", json={"prompt": "a fox", "num_inference_steps": 1000})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"][-1] == "num_inference_steps" and "at most 999" in error["msg"], error
