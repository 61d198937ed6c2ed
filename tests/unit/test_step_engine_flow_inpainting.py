"""Inpainting rows of the flow-matching families (SD3, Flux, Qwen-Image) in the step engine's running sets, on their
tiny demo pipelines (float32, CPU), against each family's inpaint pipeline (``StableDiffusion3InpaintPipeline``,
``FluxInpaintPipeline``, ``QwenImageInpaintPipeline``) derived with ``from_pipe`` as the runner derives it:

* a solo inpainting row at strengths 0.75 and 1.0 equals the pipeline's call bit for bit (latents and pixels; a
  Qwen-Image row guided by true CFG within the tolerances, its negative half being a second call there), taking only
  its strength's steps;
* a set of a text row, an image-to-image row and inpainting rows at 0.75 and 1.0, two of them joining mid-flight,
  equals each row's solo call within the tolerances;
* SD3 with a 33-channel (inpainting) transformer: its rows take mask and masked-image latents as input, solo bit
  for bit and in a set within the tolerances;
* ``step_tasks`` announces inpainting for the three families (it follows their adapters' ``tasks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model, sd3  # noqa: E402
from demo_models.components import seeded, sizes  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.step_engine import StepEngine, step_tasks  # noqa: E402
from shared.contracts import Task  # noqa: E402
from tests.unit.test_step_engine import assert_matches, denoiser_calls, run  # noqa: E402
from tests.unit.test_step_engine_flow_image_tasks import I2I, TEXT  # noqa: E402
from tests.unit.test_step_engine_image_tasks import INPAINT, INPAINT_FULL, Case, reference  # noqa: E402

FAMILIES = ("stable-diffusion-3", "flux", "qwen-image")
SD3_INPAINTING = "stable-diffusion-3+inpainting-transformer"
SIDE = 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


def denoised(case: Case) -> int:
    """Denoiser calls of a flow-matching image row: its steps from ``int(max(steps - steps x strength, 0))`` on."""
    strength = 0.8 if case.strength is None else case.strength
    return case.steps - int(max(case.steps - case.steps * strength, 0))


def load(cache: Path, family: str) -> Any:
    source = str(ensure_demo_model(cache, family))
    pipe = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module", params=FAMILIES)
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load(Path(tmp_path_factory.mktemp("step-engine-flow-inpainting")), request.param)


@pytest.fixture(scope="module")
def inpainting_pipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """SD3's demo pipeline with a 33-channel transformer of its sizes (latents, mask, masked-image latents)."""
    pipe = load(Path(tmp_path_factory.mktemp("step-engine-flow-inpainting-33")), "stable-diffusion-3")
    config = {**sizes(sd3.__file__)["transformer"], "in_channels": 33}
    pipe.transformer = seeded(diffusers.SD3Transformer2DModel, **config).eval()
    return pipe


def solo_is_exact(pipe: Any, case: Case) -> bool:
    """Whether the engine runs the pipeline's very calls for the row: all but a true-CFG-guided row."""
    return not (type(pipe).__name__.startswith("QwenImage") and case.negative is not None)


def assert_solo_rows_are_the_pipeline_call(pipe: Any) -> None:
    for case in (INPAINT, INPAINT_FULL):
        engine = StepEngine(pipe, SIDE, SIDE)
        with denoiser_calls(engine) as sizes_seen:
            finished, _ = run(engine, {0: [case.row("solo", SIDE)]})
        assert len(sizes_seen) == denoised(case), f"strength {case.strength}: its steps only"
        expected = reference(pipe, SIDE, case)
        done = finished["solo/0"]
        if not solo_is_exact(pipe, case):
            assert_matches(engine, done, expected)
            continue
        assert torch.equal(done.latents, expected.latents), f"{type(pipe).__name__} strength {case.strength}"
        (image,) = engine.decode([done])
        assert np.array_equal(np.asarray(image, dtype=np.int16), expected.pixels)


def test_an_inpainting_row_alone_is_the_pipeline_call(pipe: Any) -> None:
    assert_solo_rows_are_the_pipeline_call(pipe)


def test_text_image_and_inpainting_rows_share_a_set(pipe: Any) -> None:
    """A text row, an image-to-image row and inpainting rows at 0.75 and 1.0; two join at step 1."""
    cases = {"t": TEXT, "a": I2I, "c": INPAINT, "d": INPAINT_FULL}
    joins = {0: ["t", "c"], 1: ["a", "d"]}
    engine = StepEngine(pipe, SIDE, SIDE)
    with denoiser_calls(engine) as sizes_seen:
        finished, _ = run(engine, {k: [cases[n].row(n, SIDE) for n in names] for k, names in joins.items()})
    assert max(sizes_seen) > 3, "the rows shared steps"
    for name, case in cases.items():
        assert_matches(engine, finished[f"{name}/0"], reference(pipe, SIDE, case))


def test_the_rows_announce_inpainting(pipe: Any) -> None:
    assert step_tasks(pipe) == (Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE, Task.INPAINT)


def test_rows_of_an_inpainting_transformer_take_mask_and_masked_latents(inpainting_pipe: Any) -> None:
    assert_solo_rows_are_the_pipeline_call(inpainting_pipe)
    engine = StepEngine(inpainting_pipe, SIDE, SIDE)
    finished, _ = run(engine, {0: [INPAINT.row("c", SIDE)], 1: [INPAINT_FULL.row("d", SIDE)]})
    assert_matches(engine, finished["c/0"], reference(inpainting_pipe, SIDE, INPAINT))
    assert_matches(engine, finished["d/0"], reference(inpainting_pipe, SIDE, INPAINT_FULL))
