"""Image-to-image and inpainting on the real tiny demo pipeline: fused == solo, and batched by the fleet.

The derived pipelines come from ``from_pipe`` (the same weights); each request has its own input image, mask and
seed, and a fused row must equal its solo run within 1/255.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages
from shared.contracts import RequestSpec, Task
from shared.settings import Settings
from tests.integration.conftest import Fleet, running_fleet
from tests.integration.test_diffusers_runner import max_diff
from tests.support.redis_server import RedisServer
from tests.support.specs import demo_spec

SIZE, STEPS = 64, 6


def picture(seed: int, size: int = SIZE) -> Image.Image:
    """A smooth random RGB picture (distinct per seed)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((size, size), Image.Resampling.BILINEAR)


def mask(seed: int) -> Image.Image:
    """White (repaint) in one random rectangle, black elsewhere."""
    rng = np.random.default_rng(seed)
    array = np.zeros((SIZE, SIZE), dtype=np.uint8)
    x, y = rng.integers(0, SIZE // 2, size=2)
    array[y : y + SIZE // 2, x : x + SIZE // 2] = 255
    return Image.fromarray(array)


def spec(task: Task, prompt: str, seed: int, strength: float = 0.75) -> RequestSpec:
    rid = f"{task}-{prompt}-{seed}"
    return demo_spec(rid, STEPS, 5.0, side=SIZE, seed=seed, prompt=prompt, task=task, strength=strength)


@pytest.fixture(scope="module")
def runner(model_cache: Path) -> DiffusersRunner:
    return DiffusersRunner(Settings(model_cache_dir=model_cache))


def no_stop(step: int, total: int) -> bool:
    return False


@pytest.mark.parametrize("task", [Task.IMAGE_TO_IMAGE, Task.INPAINT])
def test_fused_rows_equal_their_solo_runs(runner: DiffusersRunner, task: Task) -> None:
    assert task in runner.tasks
    specs = [spec(task, prompt, seed) for seed, prompt in enumerate(["a cat", "a red house", "the sea"], start=3)]
    inputs = {s.id: InputImages(picture(i), mask(i) if task is Task.INPAINT else None) for i, s in enumerate(specs)}
    steps_seen: list[tuple[int, int]] = []
    fused = runner.run(specs, lambda step, total: steps_seen.append((step, total)) or False, inputs=inputs)
    assert steps_seen[-1] == (int(STEPS * 0.75), int(STEPS * 0.75))  # strength: only the last part of the schedule
    for s, (image,) in zip(specs, fused, strict=True):
        (solo,) = runner.run([s], no_stop, inputs={s.id: inputs[s.id]})[0]
        assert image.size == (SIZE, SIZE)
        assert max_diff(image, solo) <= 1, f"{s.id}: fused row differs from its solo run"
    assert max_diff(fused[0][0], fused[1][0]) > 10  # different inputs and seeds: different images
    assert max_diff(fused[0][0], picture(0)) > 0  # it did change the input


def test_strength_sets_how_much_of_the_schedule_runs(runner: DiffusersRunner) -> None:
    low, high = spec(Task.IMAGE_TO_IMAGE, "a cat", 1, 0.5), spec(Task.IMAGE_TO_IMAGE, "a cat", 1, 1.0)
    inputs = {s.id: InputImages(picture(9)) for s in (low, high)}
    totals: list[int] = []
    (a,) = runner.run([low], lambda step, total: totals.append(total) or False, inputs=inputs)[0]
    (b,) = runner.run([high], lambda step, total: totals.append(total) or False, inputs=inputs)[0]
    assert sorted(set(totals)) == [STEPS // 2, STEPS]
    assert max_diff(a, b) > 10


def encoded(image: Image.Image, format: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_fleet_fuses_image_requests_and_each_equals_its_solo_run(fleet: Fleet, runner: DiffusersRunner) -> None:
    body = {"num_inference_steps": STEPS, "guidance_scale": 5.0, "strength": 0.75}
    requests = [
        {**body, "prompt": f"variation {i}", "seed": 40 + i, "image": encoded(picture(20 + i, size=96), "JPEG")}
        for i in range(4)
    ]
    requests.append({**body, "prompt": "stronger", "seed": 50, "image": encoded(picture(30)), "strength": 0.5})
    masked = {"image": encoded(picture(31)), "mask_image": encoded(mask(2))}
    requests.append({**body, "prompt": "masked", "seed": 51, **masked})
    ids = fleet.http.post("/v1/requests/batch", json={"requests": requests}).json()["ids"]
    states = fleet.wait_done(ids)
    assert {s["status"] for s in states.values()} == {"succeeded"}, states
    same_key = [states[rid] for rid in ids[:4]]
    assert max(s["batch_size"] for s in same_key) > 1  # fused
    assert states[ids[4]]["batch_id"] not in {s["batch_id"] for s in same_key}  # other strength: never shared
    assert states[ids[5]]["batch_id"] not in {s["batch_id"] for s in same_key}  # other task: never shared
    assert [states[rid]["params"]["task"] for rid in ids] == ["image-to-image"] * 5 + ["inpaint"]
    for rid, request in zip(ids[:4], requests[:4], strict=True):
        stored = Image.open(io.BytesIO(fleet.image(rid)))
        assert stored.size == (SIZE, SIZE)  # the 96 px input was resized to the requested size
        resized = Image.open(io.BytesIO(base64.b64decode(request["image"]))).convert("RGB")
        resized = resized.resize((SIZE, SIZE), Image.Resampling.LANCZOS)
        solo_spec = spec(Task.IMAGE_TO_IMAGE, request["prompt"], request["seed"])
        (solo,) = runner.run([solo_spec], no_stop, inputs={solo_spec.id: InputImages(resized)})[0]
        assert max_diff(stored, solo) <= 1, f"{rid}: the fleet's image differs from its solo run"


def test_a_fleet_whose_runner_cannot_do_image_tasks_refuses_them_up_front(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_dir = tmp_path_factory.mktemp("text-only-logs")
    with running_fleet(redis_server, model_cache, lora_dir, log_dir, FUSEFLEET_RUNNER="bench.runners:NullRunner") as f:
        response = f.http.post("/v1/requests", json={"prompt": "a fox", "image": encoded(picture(1))})
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "image"]
        assert "does not do image-to-image; it does text-to-image" in error["msg"]
        states = f.wait_done([f.submit(prompt="text still works")])  # and text-to-image is served
        assert {s["status"] for s in states.values()} == {"succeeded"}
