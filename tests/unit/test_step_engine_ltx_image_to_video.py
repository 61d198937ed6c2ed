"""LTX-Video's image-to-video rows in the step engine (``gpu_worker.step_engine.ltx_image_task``), on the tiny demo
pipeline loaded as the worker loads it (float32, CPU), 17-frame 64 x 64 videos at 8 fps, against
``LTXImageToVideoPipeline`` on the same components (the request-level runner's pipeline for the task):

* an image-to-video row alone equals the pipeline call bit for bit when guided; unguided within the tolerances
  (the pipeline feeds the transformer its packed latents as a non-contiguous view, the engine a contiguous batch:
  another matmul reduction order, ~2e-7, as for an unguided text-to-video row);
* text-to-video and image-to-video rows of different steps, guidance scales and negative prompts share each step
  (one transformer call, a timestep per token for every row while an image row is in it, one per row otherwise)
  and equal their solo calls within 1/255;
* an image-to-video row joining a running text set mid-flight, and the peers of an aborted image-to-video row,
  equal their solo calls; the first latent frame stays the image's through every step;
* the family announces the task, and a text and an image request of one canvas have one step key.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.runner import Video  # noqa: E402
from gpu_worker.step_engine import Finished, Row, StepEngine, step_tasks  # noqa: E402
from gpu_worker.step_engine.ltx_image_task import CONDITIONING_MASK  # noqa: E402
from shared.compat import step_key  # noqa: E402
from shared.contracts import Task  # noqa: E402
from tests.support.video import picture  # noqa: E402
from tests.unit.test_step_engine import Case, Reference, assert_matches, denoiser_calls, pixels, run, spec  # noqa: E402

SIDE, FRAMES, FPS = 64, 17, 8
"""Every row's canvas: 3 latent frames of 2 x 2 tokens (the demo VAE compresses 8 x 32 x 32) at 8 fps."""


@dataclass(frozen=True)
class VideoCase(Case):
    """A row's parameters; ``image``: the seed of its first frame's picture (None: a text-to-video row)."""

    image: int | None = None

    def row(self, request_id: str) -> Row:
        row = super().row(request_id)
        if self.image is None:
            return row
        return replace(row, task=Task.IMAGE_TO_IMAGE, image=picture(self.image, SIDE))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def pipes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The demo LTX-Video pipeline as the worker loads it, and its image-to-video pipeline on the same components
    (``from_pipe``, as the request-level runner derives it)."""
    source = str(ensure_demo_model(Path(tmp_path_factory.mktemp("ltx-i2v-models")), "ltx-video"))
    pipe = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
    pipe.set_progress_bar_config(disable=True)
    i2v = diffusers.LTXImageToVideoPipeline.from_pipe(pipe)
    i2v.set_progress_bar_config(disable=True)
    return pipe, i2v


def engine_of(pipes: tuple[Any, Any]) -> StepEngine:
    return StepEngine(pipes[0], SIDE, SIDE, num_frames=FRAMES, fps=FPS)


def reference(pipes: tuple[Any, Any], case: VideoCase) -> Reference:
    """``case`` alone through its pipeline (image-to-video for a row with an image): final latents and frames."""
    final: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        final[:] = [tensors["latents"].clone()]
        return tensors

    kwargs: dict[str, Any] = {} if case.negative is None else {"negative_prompt": [case.negative]}
    if case.image is not None:
        kwargs["image"] = [picture(case.image, SIDE)]
    pipe = pipes[0] if case.image is None else pipes[1]
    result = pipe(
        prompt=[case.prompt],
        generator=[torch.Generator().manual_seed(case.seed)],
        num_inference_steps=case.steps,
        guidance_scale=case.guidance,
        width=SIDE,
        height=SIDE,
        num_frames=FRAMES,
        frame_rate=FPS,
        output_type="pil",
        callback_on_step_end=keep,
        **kwargs,
    )
    return Reference(final[0], pixels(Video(frames=result.frames[0], fps=FPS)))


def first_frame(engine: StepEngine, latents: torch.Tensor) -> torch.Tensor:
    """The first latent frame's tokens of packed latents (patch sizes 1: the first ``height x width`` tokens)."""
    _, height, width = engine.adapter.latent_grid()  # type: ignore[attr-defined]
    return latents[:, : height * width]


I2V_GUIDED = VideoCase("a red fox", steps=4, guidance=5.0, seed=1, negative="blurry", image=1)
I2V_BY_DEFAULT = VideoCase("a cat on a mat", steps=3, guidance=4.0, seed=3, image=3)  # guided by ""
I2V_UNGUIDED = VideoCase("a blue whale", steps=3, guidance=1.0, seed=2, image=2)
MIXED = [
    VideoCase("a red fox", steps=4, guidance=5.0, seed=11, negative="blurry"),
    VideoCase("a harbour", steps=3, guidance=3.0, seed=12, image=12),
    VideoCase("a lighthouse", steps=5, guidance=1.0, seed=13, image=13),
    VideoCase("a tree", steps=2, guidance=1.0, seed=14),
    VideoCase("an owl", steps=4, guidance=7.5, seed=15, negative="day", image=15),
]


def test_an_image_to_video_row_alone_is_the_pipeline_call(pipes: tuple[Any, Any]) -> None:
    for case in (I2V_GUIDED, I2V_BY_DEFAULT, I2V_UNGUIDED):
        engine = engine_of(pipes)
        finished, at = run(engine, {0: [case.row("solo")]})
        done, expected = finished["solo/0"], reference(pipes, case)
        assert at["solo/0"] == case.steps
        if not engine.adapter.guided(done.row):
            assert_matches(engine, done, expected)
            continue
        assert torch.equal(done.latents, expected.latents), f"{case} differs from the pipeline"
        (output,) = engine.decode([done])
        assert np.array_equal(pixels(output), expected.pixels)


def test_text_and_image_rows_of_other_steps_and_guidance_share_each_step(pipes: tuple[Any, Any]) -> None:
    engine = engine_of(pipes)
    engine.join([case.row(f"r{i}") for i, case in enumerate(MIXED)])
    timesteps: list[tuple[int, ...]] = []
    finished: dict[str, Finished] = {}
    at: dict[str, int] = {}

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        timesteps.append(tuple(kwargs["timestep"].shape))

    handle = engine.adapter.denoiser.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with denoiser_calls(engine) as sizes:
            step = 0
            while len(engine):
                step += 1
                for done in engine.step():
                    finished[done.row.id], at[done.row.id] = done, step
    finally:
        handle.remove()
    live = [[case for case in MIXED if case.steps > done] for done in range(step)]
    halves = [sum(2 if case.guidance > 1 else 1 for case in cases) for cases in live]
    assert sizes == halves, "one transformer call per step over every live row's halves"
    tokens = int(engine.adapter.conditioning_mask().shape[1])  # type: ignore[attr-defined]
    expected_shapes = [
        (count, tokens) if any(case.image is not None for case in cases) else (count,)
        for count, cases in zip(halves, live, strict=True)
    ]
    assert timesteps == expected_shapes, "a timestep per token while an image row is in the call"
    assert at == {f"r{i}/0": case.steps for i, case in enumerate(MIXED)}
    outputs = engine.decode([finished[f"r{i}/0"] for i in range(len(MIXED))])  # one batched decode
    assert len({pixels(output).tobytes() for output in outputs}) == len(MIXED), "rows are not distinct"
    for i, case in enumerate(MIXED):
        assert_matches(engine, finished[f"r{i}/0"], reference(pipes, case))


def test_an_image_row_joins_mid_flight_and_an_aborted_one_leaves(pipes: tuple[Any, Any]) -> None:
    text = VideoCase("a red fox", steps=5, guidance=5.0, seed=21, negative="blurry")
    doomed = VideoCase("a blue whale", steps=5, guidance=3.0, seed=22, image=22)
    joiner = VideoCase("a lighthouse at night", steps=3, guidance=4.0, seed=23, image=23)
    engine = engine_of(pipes)
    engine.join([text.row("a"), doomed.row("b")])
    kept = first_frame(engine, engine._live["b/0"].latents).clone()
    with denoiser_calls(engine) as sizes:
        engine.step()
        engine.step()
        assert torch.equal(first_frame(engine, engine._live["b/0"].latents), kept), "the first frame is kept"
        assert engine.abort("b/0") and engine.live == ("a/0",)
        engine.step()
        finished, at = run(engine, {0: [joiner.row("c")]})
    assert sizes == [4, 4, 2, 4, 4, 2], "the aborted row's halves leave, the joiner's come in"
    assert at == {"a/0": 2, "c/0": 3} and sorted(finished) == ["a/0", "c/0"]
    assert_matches(engine, finished["a/0"], reference(pipes, text))
    expected = reference(pipes, joiner)
    assert_matches(engine, finished["c/0"], expected)
    assert torch.equal(first_frame(engine, finished["c/0"].latents), first_frame(engine, expected.latents))


def test_the_family_carries_image_to_video_rows_in_its_text_sets(pipes: tuple[Any, Any]) -> None:
    pipe = pipes[0]
    tasks = step_tasks(pipe)
    assert tasks == (Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE), "no inpainting: a video family has none"
    shape = {"width": SIDE, "height": SIDE, "num_frames": FRAMES, "fps": FPS}
    text, image = spec(**shape), spec(**shape, task=Task.IMAGE_TO_IMAGE, strength=0.6)
    assert step_key(text, tasks) == step_key(image, tasks), "one running set for both"
    engine = StepEngine.for_key(pipe, step_key(image, tasks))
    with pytest.raises(ValueError, match="task"):
        engine.join([replace(VideoCase("a", 2, 1.0, 1, image=1).row("x"), task=Task.INPAINT, mask=picture(2, SIDE))])
    prompt = engine.adapter.encode([VideoCase("a", 2, 3.0, 1, image=1).row("x"), VideoCase("b", 2, 3.0, 2).row("y")])
    image_halves = [prompt[0].cond, prompt[0].uncond or {}]
    assert all(CONDITIONING_MASK in half for half in image_halves), "an image row's halves carry its mask"
    assert CONDITIONING_MASK not in prompt[1].cond, "a text row's halves carry no mask"
