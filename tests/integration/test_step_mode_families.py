"""Step mode end to end for the families with adapters beyond SD 1.x/2.x and SD3 (SDXL, PixArt-Sigma, Flux, Sana,
Qwen-Image, LTX-Video at 9 frames): real api, scheduler and worker processes (``FUSEFLEET_STEP_MODE=1``,
``FUSEFLEET_DEMO_FAMILY``) on each family's tiny demo pipeline, black-box. Requests with other step counts and
guidance scales (and, where the family takes them, negative prompts; with a true CFG scale of their own where the
family has true CFG) join a long request's running set at a step boundary and leave it when done, each image (each
video's every frame) equal to its solo run within 1/255; the long request, aborted, leaves the set. Where the
family's adapter carries image tasks, an image-to-image and an inpainting request join a text set at their strengths
and equal their solo runs within 1/255 (LTX-Video's image-to-image is image-to-video: the image its first frame, no
strength; every frame compared).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.families import FAMILIES
from gpu_worker.runner import InputImages
from gpu_worker.step_engine import ADAPTERS
from shared.contracts import RequestSpec, Task
from shared.settings import Settings
from tests.integration.conftest import Fleet, running_fleet
from tests.integration.test_image_tasks import encoded, mask, picture
from tests.support.redis_server import RedisServer
from tests.support.solo import array_of, no_stop, png_array, solo_image

pytestmark = pytest.mark.timeout(600)

STEP_FAMILIES = [
    "stable-diffusion-xl",
    "pixart",
    "flux",
    "sana",
    "qwen-image",
    "ltx-video",
]
FRAMES = 9  # a video family's requests (one step key: every request of the set has these frames)
SIDE = 32
LONG_STEPS = 900  # runs while the others join and leave, aborted at the end (DDIM takes at most 1000 steps)


@pytest.fixture(scope="module", params=STEP_FAMILIES)
def family_fleet(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    model_cache: Path,
    lora_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Fleet]]:
    family = str(request.param)
    ensure_demo_model(model_cache, family)  # built once here, not under the worker's start timeout
    env = {
        "FUSEFLEET_RUNNER": "gpu_worker.diffusers_runner:DiffusersRunner",
        "FUSEFLEET_DEMO_FAMILY": family,
        "FUSEFLEET_STEP_MODE": "1",
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    }
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path_factory.mktemp(f"{family}-logs"), **env) as fleet:
        yield family, fleet


def joiner_bodies(family: str) -> list[dict[str, Any]]:
    """Requests of other step counts and guidance scales; negative prompts where the family takes them, with a true
    CFG scale of their own where it has true CFG."""
    traits = FAMILIES[family].traits
    negative = traits.negative_prompt
    true_cfg = [
        {"prompt": "a fox", "num_inference_steps": 4, "seed": 8, "negative_prompt": "fog", "true_cfg_scale": 3.0},
    ]
    return [
        *(true_cfg if traits.true_cfg_scale else []),
        {"prompt": "a cat", "num_inference_steps": 3, "guidance_scale": 1.0, "seed": 5},
        {"prompt": "a dog", "num_inference_steps": 5, "guidance_scale": 5.0, "seed": 6}
        | ({"negative_prompt": "blurry"} if negative else {}),
        {"prompt": "two owls", "num_inference_steps": 4, "guidance_scale": 7.5, "seed": 7},
    ]


def test_mixed_requests_join_a_running_set_and_equal_their_solo_runs(
    family_fleet: tuple[str, Fleet], model_cache: Path, lora_dir: Path
) -> None:
    family, fleet = family_fleet
    shape = {"width": SIDE, "height": SIDE} | ({"num_frames": FRAMES} if FAMILIES[family].traits.video else {})
    long = fleet.submit(prompt="the long one", num_inference_steps=LONG_STEPS, **shape)
    fleet.wait_running(long, min_step=2, timeout=120)
    joiners = [fleet.submit(**shape, **body) for body in joiner_bodies(family)]
    states = fleet.wait_done(joiners, timeout=180)
    assert {s["status"] for s in states.values()} == {"succeeded"}, states
    assert fleet.get(long)["status"] == "running", "the joiners waited for the long request instead of joining it"
    workers = {fleet.redis.hget(fleet.keys.request(rid), "worker") for rid in [long, *joiners]}
    assert len(workers) == 1, workers

    answer = fleet.http.post(f"/v1/requests/{long}/abort")
    assert answer.status_code == 200, answer.text
    aborted = fleet.wait_done([long], timeout=30)[long]
    assert aborted["status"] == "aborted" and aborted["progress"]["step"] < LONG_STEPS

    solo_runner = DiffusersRunner(
        Settings(model_cache_dir=model_cache, lora_dir=lora_dir, demo_family=family)
    )
    assert solo_runner.traits.family == family
    for rid, state in states.items():
        total = state["params"]["num_inference_steps"]
        assert state["progress"] == {"step": total, "total": total}, state["progress"]
        stored = np.stack([png_array(fleet.image(rid, i)) for i in range(len(state["images"]))])  # a video's frames
        difference = np.abs(stored - solo_image(solo_runner, state)).max()
        assert difference <= 1, f"{family}: {rid} differs from its solo run by {difference}/255"


def assert_an_image_request_joins(
    family_fleet: tuple[str, Fleet], model_cache: Path, lora_dir: Path, task: Task, inputs: InputImages, **body: Any
) -> None:
    """An image request of ``task`` (``inputs`` of the set's size: an image, and a mask for inpainting) joins a
    long text-to-image request's running set where the family's step adapter carries its task
    (``FamilyAdapter.tasks``; skipped elsewhere), succeeds on that set's worker while the long one runs (aborted
    after), and equals its solo run (``DiffusersRunner.run`` with ``inputs``, request-level) within 1/255."""
    family, fleet = family_fleet
    if task not in ADAPTERS[family].tasks:
        pytest.skip(f"{family}'s step rows do not carry {task} (run request-level where the family has a pipeline)")
    frames: dict[str, Any] = {}
    if FAMILIES[family].traits.video:  # image-to-video: the image is the first frame, no strength (the api says so)
        frames = {"num_frames": FRAMES}
        body = {name: value for name, value in body.items() if name != "strength"}
    long = fleet.submit(prompt="the long one", num_inference_steps=LONG_STEPS, width=SIDE, height=SIDE, **frames)
    fleet.wait_running(long, min_step=2, timeout=120)
    images = {"image": encoded(inputs.image)} | ({"mask_image": encoded(inputs.mask)} if inputs.mask else {})
    joiner = fleet.submit(**body, **images, width=SIDE, height=SIDE, **frames)
    state = fleet.wait_done([joiner], timeout=180)[joiner]
    assert state["status"] == "succeeded", state
    assert fleet.get(long)["status"] == "running", f"the {task} request waited for the long one instead of joining it"
    workers = {fleet.redis.hget(fleet.keys.request(rid), "worker") for rid in (long, joiner)}
    assert len(workers) == 1, workers
    fleet.http.post(f"/v1/requests/{long}/abort")
    assert fleet.wait_done([long], timeout=30)[long]["status"] == "aborted"

    params = state["params"]
    assert params["task"] == task and params.get("strength") == body.get("strength"), params
    solo_runner = DiffusersRunner(
        Settings(model_cache_dir=model_cache, lora_dir=lora_dir, demo_family=family)
    )
    spec = RequestSpec(
        id="solo",
        model="demo",
        prompt=params["prompt"],
        seed=state["seed"],
        width=SIDE,
        height=SIDE,
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        task=task,
        strength=params.get("strength"),
        num_frames=params.get("num_frames"),
        created_at=0.0,
    )
    ((solo,),) = solo_runner.run([spec], no_stop, inputs={"solo": inputs})
    stored = np.stack([png_array(fleet.image(joiner, i)) for i in range(len(state["images"]))])  # a video's frames
    difference = np.abs(stored - array_of(solo)).max()
    assert difference <= 1, f"{family}: the {task} request differs from its solo run by {difference}/255"


def test_an_image_to_image_request_joins_the_running_set_at_its_strength(
    family_fleet: tuple[str, Fleet], model_cache: Path, lora_dir: Path
) -> None:
    body = {"prompt": "a harbour", "num_inference_steps": 5, "guidance_scale": 3.0, "seed": 41, "strength": 0.6}
    inputs = InputImages(picture(41, SIDE))
    assert_an_image_request_joins(family_fleet, model_cache, lora_dir, Task.IMAGE_TO_IMAGE, inputs, **body)


def test_an_inpainting_request_joins_the_running_set_at_its_strength(
    family_fleet: tuple[str, Fleet], model_cache: Path, lora_dir: Path
) -> None:
    body = {"prompt": "a window", "num_inference_steps": 5, "guidance_scale": 3.0, "seed": 43, "strength": 0.75}
    inputs = InputImages(picture(43, SIDE), mask(3).resize((SIDE, SIDE), Image.Resampling.NEAREST))
    assert_an_image_request_joins(family_fleet, model_cache, lora_dir, Task.INPAINT, inputs, **body)
