"""The tiny Wan 2.x text-to-video pipeline (demo_models/wan.py) and the facts the ``wan`` family's traits rest on;
last, the tiny image-to-video one (demo_models/wan_i2v.py) and the ``wan-i2v`` family's.

Loaded back through ``save_pretrained``/``from_pretrained`` as a worker would; asserts the frame-count and size rules,
the call's parameters, fused == solo with one generator per video (prompts of different lengths, each with its own
negative prompt), what changes the output (so what the batch key must hold), callbacks and interruption.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from demo_models import wan as tiny_wan  # noqa: E402
from demo_models import wan_i2v as tiny_i2v  # noqa: E402
from gpu_worker.families import FAMILIES, family_of  # noqa: E402
from shared.contracts import RequestSpec, Task  # noqa: E402
from tests.support.tiny_video import NEGATIVES, PROMPTS, SEEDS, frames_of, generators, loaded_back, pixels  # noqa: E402

SIZE = 32  # a small valid side (multiples of 16); 16 itself is one latent patch
FRAMES = 5  # the smallest video frame count of the 4k + 1 rule (1 is a still)
BASE: dict[str, Any] = {
    "height": SIZE,
    "width": SIZE,
    "num_inference_steps": 2,
    "max_sequence_length": 16,
    "guidance_scale": 4.0,
    "output_type": "pil",  # what the runner asks for (Wan's own default is numpy)
}


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return loaded_back(tiny_wan.build, tmp_path_factory.mktemp("tiny-wan"))


@pytest.fixture(scope="module")
def fused(pipe: Any) -> list[list[Image.Image]]:
    """Three prompts (each with its own negative prompt) in ONE call with one generator per video."""
    out = pipe(prompt=PROMPTS, negative_prompt=NEGATIVES, num_frames=FRAMES, generator=generators(SEEDS), **BASE)
    return frames_of(out)


def test_loads_back_as_wan_pipeline_of_the_wan_family(pipe: Any, fused: list[list[Image.Image]]) -> None:
    from diffusers import WanPipeline

    assert type(pipe) is WanPipeline and tiny_wan.FAMILY == "wan"
    assert family_of(pipe) is FAMILIES["wan"]
    assert pipe.transformer_2 is None  # Wan 2.1's layout: one transformer, no boundary_ratio
    assert isinstance(fused, list) and len(fused) == len(PROMPTS)  # one list of frames per video
    for frames in fused:
        assert isinstance(frames, list) and len(frames) == FRAMES
        assert all(isinstance(f, Image.Image) and f.size == (SIZE, SIZE) and f.mode == "RGB" for f in frames)
    assert not np.array_equal(pixels(fused[0]), pixels(fused[1]))  # distinct videos, not one repeated


def test_the_traits_are_the_pipelines_rules(pipe: Any) -> None:
    traits = FAMILIES["wan"].traits
    patch = pipe.transformer.config.patch_size
    assert pipe.vae_scale_factor_spatial * patch[1] == traits.size_multiple == tiny_wan.SIZE_MULTIPLE == 16
    assert pipe.vae_scale_factor_temporal == traits.frames_multiple == tiny_wan.FRAME_MULTIPLE == 4
    params = inspect.signature(pipe.__call__).parameters
    assert params["num_frames"].default == traits.default_frames == 81
    assert params["max_sequence_length"].default == traits.max_sequence_length == 512
    assert traits.video and traits.default_fps == 16 and not traits.guidance_rescale and not traits.true_cfg_scale
    assert hasattr(pipe, "load_lora_weights")  # the runner announces lora=True


def test_build_is_identical_across_builds() -> None:
    a, b = tiny_wan.build(), tiny_wan.build()
    for name in ("transformer", "vae", "text_encoder"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not getattr(a, name).training  # eval mode: no dropout, so calls are deterministic


def test_fused_equals_solo(pipe: Any, fused: list[list[Image.Image]]) -> None:
    for index, (prompt, negative, seed) in enumerate(zip(PROMPTS, NEGATIVES, SEEDS, strict=True)):
        out = pipe(prompt=prompt, negative_prompt=negative, num_frames=FRAMES, generator=generators([seed])[0], **BASE)
        solo = frames_of(out)[0]
        np.testing.assert_allclose(pixels(solo), pixels(fused[index]), rtol=0, atol=1, err_msg=f"video {index}")


def test_frame_count_rule_is_4k_plus_1_and_silently_rounded(pipe: Any) -> None:
    def count(num_frames: int) -> int:
        out = pipe(prompt="cat", num_frames=num_frames, **{**BASE, "num_inference_steps": 1})
        return len(frames_of(out)[0])

    assert [count(n) for n in (1, 5, 9)] == [1, 5, 9]
    assert [count(n) for n in (4, 6, 8)] == [5, 5, 9]  # n // 4 * 4 + 1 frames (up or down), a warning, no error


def test_size_multiple_is_16(pipe: Any) -> None:
    out = pipe(prompt="cat", num_frames=1, **{**BASE, "width": 48, "num_inference_steps": 1})
    assert frames_of(out)[0][0].size == (48, 32)  # PIL size is (width, height): non-square sizes work
    for height, width in ((40, 32), (32, 24)):
        with pytest.raises(ValueError, match="divisible by 16"):
            pipe(prompt="cat", num_frames=1, **{**BASE, "height": height, "width": width})


def test_call_parameters(pipe: Any) -> None:
    params = inspect.signature(pipe.__call__).parameters
    for name in ("negative_prompt", "guidance_scale", "max_sequence_length", "num_videos_per_prompt"):
        assert name in params, name
    assert "callback_on_step_end" in params
    for name in ("frame_rate", "fps", "guidance_rescale", "image"):  # fps is the MP4's only; no rescale, no image
        assert name not in params, name
    family = FAMILIES["wan"]
    head = RequestSpec.model_validate(
        {
            "id": "r",
            "model": "m",
            "prompt": "p",
            "seed": 1,
            "width": 32,
            "height": 32,
            "num_inference_steps": 2,
            "guidance_scale": 4.0,
            "created_at": 0.0,
            "fps": 8,
            "max_sequence_length": 64,
        }
    )
    assert family.call_kwargs(head, frozenset(params)) == {"num_frames": 81, "max_sequence_length": 64}
    assert family.fps(head) == 8 and family.per_prompt_kwarg == "num_videos_per_prompt"


def test_sequence_length_and_negative_prompt_change_the_output(pipe: Any) -> None:
    """max_sequence_length belongs in the batch key (the prompt's embedding is zero-padded to it, and cross
    attention sees the padding); negative_prompt need not: it is a per-video list (test_fused_equals_solo)."""

    def run(**kwargs: Any) -> np.ndarray:
        out = pipe(prompt="a red fox", num_frames=FRAMES, generator=generators([5])[0], **{**BASE, **kwargs})
        return pixels(frames_of(out)[0])

    base = run()
    assert np.array_equal(base, run(max_sequence_length=16))
    assert not np.array_equal(base, run(max_sequence_length=24))
    assert not np.array_equal(base, run(negative_prompt="blurry"))  # used (guidance_scale 4 > 1: CFG is on)


def test_callback_on_step_end_and_interrupt(pipe: Any) -> None:
    assert pipe._callback_tensor_inputs == ["latents", "prompt_embeds", "negative_prompt_embeds"]
    steps: list[int] = []

    def stop(p: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        steps.append(step)
        assert tensors["latents"].shape[0] == 2  # batch of two videos
        p._interrupt = True
        return tensors

    out = pipe(
        prompt=PROMPTS[:2],
        num_frames=FRAMES,
        generator=generators(SEEDS[:2]),
        callback_on_step_end=stop,
        **{**BASE, "num_inference_steps": 4},
    )
    assert steps == [0]  # remaining steps are skipped ...
    frames = frames_of(out)  # ... and the partly denoised latents are still decoded, for the whole batch
    assert len(frames) == 2 and all(len(f) == FRAMES for f in frames)


# --- the image-to-video model (demo_models/wan_i2v.py) ---


def test_the_image_to_video_model_has_wans_rules_and_diffusers_test_layout(tmp_path: Path) -> None:
    """The ``wan-i2v`` family's traits are Wan's (its VAE and patches are text-to-video Wan's); its loaded pipeline
    is image-to-video only (``image`` is required), two transformers of 36 input channels, no image encoder."""
    from diffusers import DiffusionPipeline, WanImageToVideoPipeline

    tiny_i2v.build().save_pretrained(tmp_path)
    pipe: Any = DiffusionPipeline.from_pretrained(tmp_path)  # type: ignore[no-untyped-call]
    family = FAMILIES["wan-i2v"]
    assert type(pipe) is WanImageToVideoPipeline and family_of(pipe) is family and tiny_i2v.FAMILY == "wan-i2v"
    assert family.traits == FAMILIES["wan"].traits.model_copy(update={"family": "wan-i2v"})
    assert family.loaded_task is None and set(family.derived_pipelines) == {Task.IMAGE_TO_IMAGE}
    patch = pipe.transformer.config.patch_size
    assert pipe.vae_scale_factor_spatial * patch[1] == family.traits.size_multiple
    assert pipe.vae_scale_factor_temporal == family.traits.frames_multiple
    params = inspect.signature(pipe.__call__).parameters
    assert params["image"].default is inspect.Parameter.empty  # it needs an image
    assert params["num_frames"].default == family.traits.default_frames
    assert params["max_sequence_length"].default == family.traits.max_sequence_length
    assert pipe.transformer.config.in_channels == pipe.transformer_2.config.in_channels == 16 + 4 + 16
    assert pipe.image_encoder is None and pipe.config.boundary_ratio == 0.875
    weights = pipe.transformer.state_dict(), pipe.transformer_2.state_dict()
    assert not all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])  # two distinct stages
