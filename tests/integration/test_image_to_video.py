"""Image-to-video through the real runner on the tiny LTX-Video and Wan 2.2 image-to-video demo pipelines: a request
of a video model that carries an input image (task image-to-image) runs the family's image-to-video pipeline, that
image its first frame. LTX-Video's is ``LTXImageToVideoPipeline`` derived on the loaded text-to-video components;
Wan's model is an image-to-video one (``WanImageToVideoPipeline``, image-to-video only), run row-wise
(``gpu_worker.image_rows``) so one call fuses requests with different images.

For each family, a fused pair of requests (each its own image and seed) equals each one's solo run within 1/255, and
another image changes the video; the first frame is conditioned on its input: LTX holds the first latent frame at
the input's encoding while the others are denoised; Wan's transformer gets each row's own encoded input and a mask
marking the first frame only, exactly as that row's solo call gives it. Through a fleet:
tests/integration/test_openai_videos.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bench.families import family_runner, family_specs, pixels
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages
from shared.contracts import RequestSpec, Task
from tests.support.solo import no_stop
from tests.support.video import FRAMES, SIDE, STEPS, picture

pytestmark = pytest.mark.timeout(600)

I2V_FAMILIES = ("ltx-video", "wan-i2v")


@pytest.fixture(scope="module", params=I2V_FAMILIES)
def runner(request: pytest.FixtureRequest, model_cache: Path) -> DiffusersRunner:
    return family_runner(request.param, model_cache)


def i2v_specs(family: str, prompts: list[str]) -> list[RequestSpec]:
    return family_specs(
        family,
        prompts,
        side=SIDE,
        steps=STEPS,
        seed=7,
        negative="blurry {i}",
        task=Task.IMAGE_TO_IMAGE,
        num_frames=FRAMES,
    )


def test_the_image_task_is_image_to_video_on_the_loaded_components(runner: DiffusersRunner) -> None:
    from diffusers import LTXImageToVideoPipeline

    from gpu_worker.image_rows import WanImageRowsPipeline

    i2v = runner._pipes[Task.IMAGE_TO_IMAGE]
    if runner.traits.family == "ltx-video":
        assert runner.tasks == {Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE}  # no inpainting for a video family
        assert type(i2v) is LTXImageToVideoPipeline
    else:  # an image-to-video model: it needs an image, so text-to-video is not offered
        assert runner.tasks == {Task.IMAGE_TO_IMAGE}
        assert type(i2v) is WanImageRowsPipeline and i2v.config.boundary_ratio == 0.875  # its config carried over
    assert all(i2v.components[name] is runner.pipe.components[name] for name in ("transformer", "vae", "text_encoder"))
    assert runner.pipe.vae.use_slicing  # a batch decodes one video at a time: its decode memory is one video's


def test_fused_image_to_video_rows_equal_their_solo_runs(runner: DiffusersRunner) -> None:
    specs = i2v_specs(runner.traits.family, ["a red fox", "a blue whale in the sea"])
    inputs = {spec.id: InputImages(picture(i)) for i, spec in enumerate(specs)}
    fused = runner.run(specs, no_stop, inputs)
    assert [len(outputs) for outputs in fused] == [1, 1]
    videos = [pixels(outputs[0]) for outputs in fused]
    assert all(video.shape == (FRAMES, SIDE, SIDE, 3) for video in videos)
    assert np.abs(videos[0] - videos[1]).max() > 1, "rows are not distinct"
    for spec, video in zip(specs, videos, strict=True):
        (alone,) = runner.run([spec], no_stop, {spec.id: inputs[spec.id]})
        assert np.abs(video - pixels(alone[0])).max() <= 1, f"{spec.id} differs fused vs solo"
    if runner.traits.family == "ltx-video":  # Wan's tiny VAE decodes any latents near grey: its rows' conditions
        (other,) = runner.run(specs[:1], no_stop, {specs[0].id: InputImages(picture(5))})  # are compared instead
        assert np.abs(videos[0] - pixels(other[0])).max() > 1, "the input image changed nothing"


def test_ltx_holds_the_first_frame_at_its_input_while_the_rest_is_denoised(model_cache: Path) -> None:
    """LTX's image-to-video keeps the first latent frame (the input's encoding) and denoises only the others: the
    latents' first-frame tokens (one per 32x32 patch) never change from step to step, every other token does."""
    i2v: Any = family_runner("ltx-video", model_cache)._pipes[Task.IMAGE_TO_IMAGE]
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


def wan_conditions(pipe: Any, images: list[Image.Image], seeds: list[int]) -> torch.Tensor:
    """The conditioning channels (4 of first-frame mask, 16 of the encoded input clip) the transformer gets at the
    first step of one call over ``images``, one row each."""
    seen: list[torch.Tensor] = []

    def capture(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(kwargs["hidden_states"][:, pipe.vae.config.z_dim :].clone())

    hooks = [
        model.register_forward_pre_hook(capture, with_kwargs=True) for model in (pipe.transformer, pipe.transformer_2)
    ]
    try:
        pipe(
            image=images,
            prompt=[f"a red fox {seed}" for seed in seeds],
            height=SIDE,
            width=SIDE,
            num_frames=FRAMES,
            num_inference_steps=1,
            guidance_scale=1.0,  # one transformer call per step
            generator=[torch.Generator().manual_seed(seed) for seed in seeds],
            output_type="latent",
        )
    finally:
        for hook in hooks:
            hook.remove()
    return seen[0]


def test_wan_conditions_each_row_on_its_own_first_frame(model_cache: Path) -> None:
    """Wan's image-to-video concatenates to the noise a mask (1 on the first frame, 0 after) and the VAE encoding
    of the input as the first frame of an otherwise empty clip: in a fused call each row gets exactly its solo
    call's, and another image changes only its own row's."""
    i2v: Any = family_runner("wan-i2v", model_cache)._pipes[Task.IMAGE_TO_IMAGE]
    fused = wan_conditions(i2v, [picture(1), picture(2)], [3, 4])
    assert fused.shape[:2] == (2, 4 + 16)
    mask = fused[:, :4]
    assert torch.all(mask[:, :, 0] == 1) and torch.all(mask[:, :, 1:] == 0)  # the first frame only
    for row, (image, seed) in enumerate(((picture(1), 3), (picture(2), 4))):
        assert torch.equal(fused[row], wan_conditions(i2v, [image], [seed])[0]), f"row {row} differs from solo"
    other = wan_conditions(i2v, [picture(5), picture(2)], [3, 4])
    assert not torch.equal(other[0], fused[0]) and torch.equal(other[1], fused[1])
    latents = [
        i2v(
            image=image,
            prompt="a red fox",
            height=SIDE,
            width=SIDE,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            generator=torch.Generator().manual_seed(3),
            output_type="latent",
        ).frames
        for image in (picture(1), picture(5))
    ]
    assert (latents[0] - latents[1]).abs().max() > 1e-2, "the input image changed nothing"
