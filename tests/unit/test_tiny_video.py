"""The tiny LTX-Video pipeline (demo_models/video.py) and MP4 encoding (gpu_worker/video.py).

Loaded back through ``save_pretrained``/``from_pretrained`` as a worker would; asserts the facts the fleet's
batching relies on: the frame-count and size rules, the call's parameters, fused == solo with one generator per
video, callbacks and interruption, and the image-to-video variant built from the same components.
"""

from __future__ import annotations

import inspect
import io
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pytest

pytest.importorskip("diffusers")
av = pytest.importorskip("av")

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from demo_models import video as tiny_video  # noqa: E402
from gpu_worker import video  # noqa: E402
from tests.support.tiny_video import NEGATIVES, PROMPTS, SEEDS, frames_of, generators, loaded_back, pixels  # noqa: E402

SIZE = 32  # the smallest valid height and width (multiples of 32)
FRAMES = 9  # the smallest video frame count of the 8k + 1 rule (1 is a still)
BASE: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_inference_steps": 2, "max_sequence_length": 16}


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return loaded_back(tiny_video.build, tmp_path_factory.mktemp("tiny-video"))


@pytest.fixture(scope="module")
def fused(pipe: Any) -> list[list[Image.Image]]:
    """Three prompts (each with its own negative prompt) in ONE call with one generator per video."""
    out = pipe(prompt=PROMPTS, negative_prompt=NEGATIVES, num_frames=FRAMES, generator=generators(SEEDS), **BASE)
    return frames_of(out)


def test_loads_back_as_ltx_pipeline(pipe: Any, fused: list[list[Image.Image]]) -> None:
    from diffusers import LTXPipeline

    assert tiny_video.FAMILY == "ltx-video"
    assert type(pipe) is LTXPipeline
    pipe = cast(Any, pipe)
    assert pipe.vae_spatial_compression_ratio == tiny_video.SIZE_MULTIPLE == 32
    assert pipe.vae_temporal_compression_ratio == tiny_video.FRAME_MULTIPLE == 8
    assert isinstance(fused, list) and len(fused) == len(PROMPTS)  # one list of frames per video
    for frames in fused:
        assert isinstance(frames, list) and len(frames) == FRAMES
        assert all(isinstance(f, Image.Image) and f.size == (SIZE, SIZE) and f.mode == "RGB" for f in frames)
    assert not np.array_equal(pixels(fused[0]), pixels(fused[1]))  # distinct videos, not one repeated


def test_build_is_identical_across_builds() -> None:
    a, b = tiny_video.build(), tiny_video.build()
    for name in ("transformer", "vae", "text_encoder"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not getattr(a, name).training  # eval mode: no dropout, so calls are deterministic


def test_fused_equals_solo(pipe: Any, fused: list[list[Image.Image]]) -> None:
    for index, (prompt, negative, seed) in enumerate(zip(PROMPTS, NEGATIVES, SEEDS, strict=True)):
        out = pipe(prompt=prompt, negative_prompt=negative, num_frames=FRAMES, generator=generators([seed])[0], **BASE)
        solo = frames_of(out)[0]
        np.testing.assert_allclose(pixels(solo), pixels(fused[index]), rtol=0, atol=1, err_msg=f"video {index}")


def test_frame_count_rule_is_8k_plus_1_and_silently_floored(pipe: Any) -> None:
    def count(num_frames: int) -> int:
        out = pipe(prompt="cat", num_frames=num_frames, **{**BASE, "num_inference_steps": 1})
        return len(frames_of(out)[0])

    assert [count(n) for n in (1, 9, 17)] == [1, 9, 17]
    assert [count(n) for n in (8, 10, 16)] == [1, 9, 9]  # (n - 1) // 8 * 8 + 1 frames, no error


def test_size_multiple_is_32(pipe: Any) -> None:
    out = pipe(prompt="cat", num_frames=1, **{**BASE, "width": 64, "num_inference_steps": 1})
    assert frames_of(out)[0][0].size == (64, 32)  # PIL size is (width, height): non-square sizes work
    for height, width in ((48, 32), (32, 16)):
        with pytest.raises(ValueError, match="divisible by 32"):
            pipe(prompt="cat", num_frames=1, **{**BASE, "height": height, "width": width})


def test_call_parameters(pipe: Any) -> None:
    params = inspect.signature(pipe.__call__).parameters
    for name in (
        "negative_prompt",
        "guidance_scale",
        "guidance_rescale",
        "max_sequence_length",
        "frame_rate",
        "decode_timestep",
        "decode_noise_scale",
        "num_videos_per_prompt",
        "callback_on_step_end",
    ):
        assert name in params, name
    assert "guidance_scale_2" not in params and "image" not in params
    assert params["frame_rate"].default == 25 and params["guidance_scale"].default == 3
    assert params["max_sequence_length"].default == 128


def test_frame_rate_guidance_rescale_and_negative_prompt_change_the_output(pipe: Any) -> None:
    """frame_rate and guidance_rescale belong in the batch key (frame_rate scales the rotary embedding's time axis);
    negative_prompt need not: it is a per-video list (test_fused_equals_solo)."""

    def run(**kwargs: Any) -> np.ndarray:
        out = pipe(prompt="a red fox", num_frames=FRAMES, generator=generators([5])[0], **BASE, **kwargs)
        return pixels(frames_of(out)[0])

    base = run()
    assert np.array_equal(base, run(frame_rate=25))  # the default
    assert not np.array_equal(base, run(frame_rate=8))
    assert not np.array_equal(base, run(guidance_rescale=0.7))
    assert not np.array_equal(base, run(negative_prompt="blurry"))  # used (guidance_scale 3 > 1: CFG is on)


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


def test_image_to_video_from_the_same_components(pipe: Any) -> None:
    import diffusers
    from diffusers import LTXImageToVideoPipeline

    assert hasattr(diffusers, "WanImageToVideoPipeline")  # exists, but needs its own transformer (see report)
    i2v: Any = LTXImageToVideoPipeline(**pipe.components)  # type: ignore[no-untyped-call]
    i2v.set_progress_bar_config(disable=True)
    images = [Image.new("RGB", (SIZE, SIZE), color) for color in ((200, 30, 30), (30, 30, 200))]
    fused = frames_of(i2v(image=images, prompt=PROMPTS[:2], num_frames=FRAMES, generator=generators(SEEDS[:2]), **BASE))
    assert len(fused) == 2 and all(len(f) == FRAMES and f[0].size == (SIZE, SIZE) for f in fused)
    solo = frames_of(
        i2v(image=images[1], prompt=PROMPTS[1], num_frames=FRAMES, generator=generators(SEEDS[1:2]), **BASE)
    )
    np.testing.assert_allclose(pixels(solo[0]), pixels(fused[1]), rtol=0, atol=1)


# --- MP4 ---


def test_mp4_round_trip_of_pipelineframes_of(fused: list[list[Image.Image]]) -> None:
    data = video.encode_mp4(fused[0], fps=24)
    assert data[4:8] == b"ftyp"
    decoded = video.decode_mp4(data)
    assert len(decoded) == FRAMES and all(f.size == (SIZE, SIZE) and f.mode == "RGB" for f in decoded)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 24 and stream.frames == FRAMES
        assert stream.codec_context.name == ("h264" if video.video_codec() == "libx264" else "mpeg4")
        assert stream.codec_context.pix_fmt == "yuv420p"


@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
@pytest.mark.parametrize("fps", [24000 / 1001, 8.0])
def test_mp4_keeps_order_colours_and_fps(monkeypatch: pytest.MonkeyPatch, codec: str, fps: float) -> None:
    if codec == "libx264" and video.video_codec() != "libx264":
        pytest.skip("this FFmpeg build has no libx264")
    monkeypatch.setattr(video, "video_codec", lambda: codec)
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)]
    frames = [Image.new("RGB", (48, 32), colour) for colour in colours]
    data = video.encode_mp4(frames, fps=fps)
    decoded = video.decode_mp4(data)
    assert [f.size for f in decoded] == [(48, 32)] * len(colours)
    means = [np.asarray(f, dtype=np.float64).mean(axis=(0, 1)) for f in decoded]
    np.testing.assert_allclose(means, colours, atol=12)
    rate = Fraction(24000, 1001) if 23 < fps < 24 else Fraction(8)
    assert video.fps_fraction(fps) == rate
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == rate
        times = [frame.time for frame in container.decode(stream)]
    assert times == pytest.approx([float(i / rate) for i in range(len(colours))], abs=1e-3)  # frame i at i / fps


def test_encode_mp4_refuses_bad_input() -> None:
    ok = Image.new("RGB", (32, 32))
    with pytest.raises(ValueError, match="even"):
        video.encode_mp4([Image.new("RGB", (33, 32))], fps=24)
    with pytest.raises(ValueError, match="frame 1"):
        video.encode_mp4([ok, Image.new("RGB", (32, 64))], fps=24)
    with pytest.raises(ValueError, match="at least one"):
        video.encode_mp4([], fps=24)
    for fps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fps"):
            video.encode_mp4([ok], fps=fps)
    assert len(video.decode_mp4(video.encode_mp4([Image.new("RGBA", (32, 32))], fps=1))) == 1  # one frame, RGBA


def test_decode_mp4_refuses_garbage() -> None:
    with pytest.raises(ValueError):
        video.decode_mp4(b"not an mp4")
