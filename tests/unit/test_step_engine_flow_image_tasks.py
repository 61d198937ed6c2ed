"""Image-to-image rows of the flow-matching families (SD3, Flux, Qwen-Image) in the step engine's running sets, on
their tiny demo pipelines (float32, CPU), against each family's img2img pipeline (``StableDiffusion3Img2ImgPipeline``,
``FluxImg2ImgPipeline``, ``QwenImageImg2ImgPipeline``) derived with ``from_pipe`` as the runner derives it:

* a solo image-to-image row equals the pipeline's call within 1/255, taking only its strength's steps (the flow
  pipelines' ``int(max(steps - steps x strength, 0))``, not SD's ``int(steps x strength)``);
* a set of a text row and image rows of two strengths, one joining mid-flight, equals each row's solo call.

Any strength above 0 leaves a step (``int(steps - steps x strength) < steps``), so no strength is refused for leaving
none. Their inpainting rows: ``tests/unit/test_step_engine_flow_inpainting.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.step_engine import StepEngine  # noqa: E402
from shared.contracts import Task  # noqa: E402
from tests.unit.test_step_engine import assert_matches, denoiser_calls, run  # noqa: E402
from tests.unit.test_step_engine_image_tasks import Case, reference  # noqa: E402

FAMILIES = ("stable-diffusion-3", "flux", "qwen-image")
SIDE = 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py

I2I = Case("a house by a lake", steps=4, guidance=5.0, seed=31, task=Task.IMAGE_TO_IMAGE, strength=0.6)
I2I_STRONG = Case("a red car", steps=5, guidance=1.0, seed=32, task=Task.IMAGE_TO_IMAGE, strength=0.7)
TEXT = Case("a lighthouse", steps=3, guidance=6.0, seed=33)


def denoised(case: Case) -> int:
    """Denoiser calls of an SD3 row (one timestep per step)."""
    if not case.task.needs_image:
        return case.steps
    return case.steps - int(max(case.steps - case.steps * (case.strength or 0.8), 0))


@pytest.fixture(scope="module", params=FAMILIES)
def pipe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    source = str(ensure_demo_model(Path(tmp_path_factory.mktemp("step-engine-flow-image")), request.param))
    loaded = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
    loaded.set_progress_bar_config(disable=True)
    return loaded


def test_an_image_to_image_row_alone_is_the_pipeline_call(pipe: Any) -> None:
    for case in (I2I, I2I_STRONG):
        engine = StepEngine(pipe, SIDE, SIDE)
        with denoiser_calls(engine) as sizes_seen:
            finished, _ = run(engine, {0: [case.row("solo", SIDE)]})
        assert len(sizes_seen) == denoised(case) < case.steps, f"strength {case.strength}: its steps only"
        assert_matches(engine, finished["solo/0"], reference(pipe, SIDE, case))


def test_text_and_image_rows_of_other_strengths_share_a_set(pipe: Any) -> None:
    cases = {"t": TEXT, "a": I2I, "b": I2I_STRONG}
    joins = {0: ["t", "a"], 1: ["b"]}
    engine = StepEngine(pipe, SIDE, SIDE)
    with denoiser_calls(engine) as sizes_seen:
        finished, _ = run(engine, {k: [cases[n].row(n, SIDE) for n in names] for k, names in joins.items()})
    assert max(sizes_seen) > 2, "the rows shared steps"
    for name, case in cases.items():
        assert_matches(engine, finished[f"{name}/0"], reference(pipe, SIDE, case))
