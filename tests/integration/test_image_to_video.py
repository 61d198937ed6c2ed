"""Image-to-video on the real tiny LTX-Video demo pipeline: a request of a video model that carries an input image
(task image-to-image, ``PipelineFamily.derived_pipelines``) runs ``LTXImageToVideoPipeline`` on the loaded
pipeline's own components, that image its first frame.

Through the runner: a fused pair of requests, each with its own image and seed, equals each one's solo run within
1/255, and the first frame is conditioned on the input (held at its encoding while the other frames are denoised).
Through a fleet: two image-to-video requests are fused into one forward, each equal to its solo run, and the api
refuses what image-to-video does not take (``strength``, a mask) naming the field.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bench.families import family_runner, family_specs, pixels
from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages
from shared.contracts import RequestSpec, Task
from tests.integration.conftest import running_fleet
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(600)

SIDE, FRAMES, STEPS, FPS = 32, 9, 2, 8


def picture(seed: int, size: int = SIDE) -> Image.Image:
    """A smooth random RGB picture (distinct per seed)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((size, size), Image.Resampling.BILINEAR)


def no_stop(step: int, total: int) -> bool:
    return False


@pytest.fixture(scope="module")
def runner(model_cache: Path) -> DiffusersRunner:
    return family_runner("ltx-video", model_cache)


def i2v_specs(prompts: list[str]) -> list[RequestSpec]:
    return family_specs(
        "ltx-video", prompts, side=SIDE, steps=STEPS, seed=7, negative="blurry {i}", task=Task.IMAGE_TO_IMAGE
    )


def test_the_image_task_is_image_to_video_on_the_same_components(runner: DiffusersRunner) -> None:
    from diffusers import LTXImageToVideoPipeline

    assert runner.tasks == {Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE}  # no inpainting for a video family
    i2v = runner._pipes[Task.IMAGE_TO_IMAGE]
    assert type(i2v) is LTXImageToVideoPipeline
    assert all(i2v.components[name] is runner.pipe.components[name] for name in ("transformer", "vae", "text_encoder"))


def test_fused_image_to_video_rows_equal_their_solo_runs(runner: DiffusersRunner) -> None:
    specs = i2v_specs(["a red fox", "a blue whale in the sea"])
    inputs = {spec.id: InputImages(picture(i)) for i, spec in enumerate(specs)}
    fused = runner.run(specs, no_stop, inputs)
    assert [len(outputs) for outputs in fused] == [1, 1]
    videos = [pixels(outputs[0]) for outputs in fused]
    assert all(video.shape == (FRAMES, SIDE, SIDE, 3) for video in videos)
    assert np.abs(videos[0] - videos[1]).max() > 1, "rows are not distinct"
    for spec, video in zip(specs, videos, strict=True):
        (alone,) = runner.run([spec], no_stop, {spec.id: inputs[spec.id]})
        assert np.abs(video - pixels(alone[0])).max() <= 1, f"{spec.id} differs fused vs solo"
    (other,) = runner.run(specs[:1], no_stop, {specs[0].id: InputImages(picture(5))})
    assert np.abs(videos[0] - pixels(other[0])).max() > 1, "the input image changed nothing"


def test_the_first_frame_is_held_at_its_input_while_the_rest_is_denoised(runner: DiffusersRunner) -> None:
    """LTX's image-to-video keeps the first latent frame (the input's encoding) and denoises only the others: the
    latents' first-frame tokens (one per 32x32 patch) never change from step to step, every other token does."""
    i2v: Any = runner._pipes[Task.IMAGE_TO_IMAGE]
    seen: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        seen.append(tensors["latents"].clone())
        return tensors

    i2v(
        image=picture(1),
        prompt="a red fox",
        height=SIDE,
        width=SIDE,
        num_frames=FRAMES,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(3),
        callback_on_step_end=keep,
        output_type="latent",
    )
    first_frame_tokens = (SIDE // 32) ** 2
    first, last = seen[0], seen[-1]
    assert torch.equal(first[:, :first_frame_tokens], last[:, :first_frame_tokens])
    assert not torch.equal(first[:, first_frame_tokens:], last[:, first_frame_tokens:])


# --- through a fleet ---


def video_body(prompt: str, seed: int, image: Image.Image | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "seed": seed,
        "width": SIDE,
        "height": SIDE,
        "num_frames": FRAMES,
        "fps": FPS,
        "num_inference_steps": STEPS,
        "guidance_scale": 3.0,
        **extra,
    }
    if image is not None:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        body["image"] = base64.b64encode(buffer.getvalue()).decode()
    return body


def test_a_fleet_fuses_image_to_video_requests(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path: Path
) -> None:
    ensure_demo_model(model_cache, "ltx-video")  # built once here, not under the worker's start timeout
    with running_fleet(
        redis_server,
        model_cache,
        lora_dir,
        tmp_path,
        FUSEFLEET_RUNNER="gpu_worker.diffusers_runner:DiffusersRunner",
        FUSEFLEET_DEMO_FAMILY="ltx-video",
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="1000",
    ) as fleet:
        # refused up front from what the worker announced: image-to-video takes no strength and no mask
        refused = fleet.http.post("/v1/requests", json=video_body("bad", 1, picture(1), strength=0.5))
        assert refused.status_code == 422, refused.text
        assert [error["loc"][-1] for error in refused.json()["detail"]] == ["strength"]
        white = Image.new("L", (SIDE, SIDE), 255)
        buffer = io.BytesIO()
        white.save(buffer, format="PNG")
        masked = video_body("bad", 1, picture(1), mask_image=base64.b64encode(buffer.getvalue()).decode())
        refused = fleet.http.post("/v1/requests", json=masked)
        assert refused.status_code == 422 and refused.json()["detail"][0]["type"] == "task_unsupported", refused.text

        bodies = [video_body("a red fox", 1, picture(1)), video_body("a blue whale", 2, picture(2))]
        ids = fleet.submit_batch(bodies)
        states = fleet.wait_done(ids, timeout=300)
        assert [states[rid]["status"] for rid in ids] == ["succeeded"] * 2, states
        assert states[ids[0]]["batch_id"] == states[ids[1]]["batch_id"] and states[ids[0]]["batch_size"] == 2
        for rid, body in zip(ids, bodies, strict=True):
            (solo,) = fleet.submit_batch([body])
            assert fleet.wait_done([solo], timeout=300)[solo]["batch_size"] == 1
            for index in range(FRAMES):
                fused = np.asarray(Image.open(io.BytesIO(fleet.image(rid, index))), dtype=np.int16)
                alone = np.asarray(Image.open(io.BytesIO(fleet.image(solo, index))), dtype=np.int16)
                assert np.abs(fused - alone).max() <= 1, f"{rid}: frame {index} differs fused vs solo"
