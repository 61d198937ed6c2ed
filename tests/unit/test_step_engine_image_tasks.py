"""Image-to-image and inpainting rows, and LoRA adapters per row, in the step engine's running sets, on the tiny
Stable Diffusion 1.x and SDXL demo pipelines (float32, CPU; an inpainting 9-channel UNet built from SD's sizes).

* a solo image-to-image or inpainting row equals the family's own ``AutoPipelineForImage2Image`` /
  ``AutoPipelineForInpainting`` call (derived with ``from_pipe``, as the runner derives them) bit for bit;
* a set mixing text-to-image, image-to-image at two strengths and inpainting rows, some joining mid-flight, equals
  each row's solo call within the tolerances, and each image row takes only its strength's steps;
* a set whose rows have two LoRA adapters and none equals each row's solo call with its adapter active;
* what the engine refuses: a family without image tasks, an image row without its image, a strength leaving no step.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model, stable_diffusion  # noqa: E402
from demo_models.components import seeded, sizes  # noqa: E402
from gpu_worker.diffusers_runner import DERIVED_PIPELINES, absent_components  # noqa: E402
from gpu_worker.lora import LoraActivator, LoraMixingError  # noqa: E402
from gpu_worker.step_engine import Row, StepEngine  # noqa: E402
from gpu_worker.step_engine.image_task import first_step  # noqa: E402
from shared.contracts import LoraRef, Task  # noqa: E402
from tests.support.lora import make_family_lora  # noqa: E402
from tests.unit.test_step_engine import Reference, assert_matches, denoiser_calls, run  # noqa: E402

SIZES = {"stable-diffusion": 32, "stable-diffusion-xl": 32, "stable-diffusion+inpainting-unet": 32}
"""The image side of each variant: each family with image tasks, and SD with a 9-channel inpainting UNet."""

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


@dataclass(frozen=True)
class Case:
    """One row's parameters."""

    prompt: str
    steps: int
    guidance: float
    seed: int
    task: Task = Task.TEXT_TO_IMAGE
    strength: float | None = None
    negative: str | None = None
    lora: LoraRef | None = None

    def row(self, request_id: str, side: int) -> Row:
        image, mask = inputs(side, self.seed) if self.task.needs_image else (None, None)
        return Row(
            request_id=request_id,
            prompt=self.prompt,
            steps=self.steps,
            guidance_scale=self.guidance,
            generator=torch.Generator().manual_seed(self.seed),
            negative_prompt=self.negative,
            task=self.task,
            strength=self.strength,
            image=image,
            mask=mask if self.task is Task.INPAINT else None,
            lora=self.lora,
        )

    @property
    def denoised(self) -> int:
        """Denoiser calls the row takes (its strength's part of its schedule; one timestep per step here)."""
        if not self.task.needs_image:
            return self.steps
        return self.steps - first_step(self.steps, 0.8 if self.strength is None else self.strength, 1)


def inputs(side: int, seed: int) -> tuple[Image.Image, Image.Image]:
    """A random RGB input image and a mask whose right half is repainted, of ``side`` pixels."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    mask = np.zeros((side, side), dtype=np.uint8)
    mask[:, side // 2 :] = 255
    return image, Image.fromarray(mask)


I2I = Case("a house by a lake", steps=4, guidance=5.0, seed=21, task=Task.IMAGE_TO_IMAGE, strength=0.5)
I2I_STRONG = Case("a red car", steps=5, guidance=1.0, seed=22, task=Task.IMAGE_TO_IMAGE, strength=0.8)
INPAINT = Case("a cat", steps=4, guidance=4.0, seed=23, task=Task.INPAINT, strength=0.75, negative="blurry")
INPAINT_FULL = Case("a dog", steps=3, guidance=3.0, seed=24, task=Task.INPAINT, strength=1.0)
TEXT = Case("a lighthouse", steps=3, guidance=6.0, seed=25)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each family's demo pipeline, loaded as the worker loads it, and SD with an inpainting UNet."""
    cache = Path(tmp_path_factory.mktemp("step-engine-image-models"))
    loaded: dict[str, Any] = {}
    for family in ("stable-diffusion", "stable-diffusion-xl"):
        source = str(ensure_demo_model(cache, family))
        pipe = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
        pipe.set_progress_bar_config(disable=True)
        loaded[family] = pipe
    source = str(ensure_demo_model(cache, "stable-diffusion"))
    inpainting = diffusers.DiffusionPipeline.from_pretrained(source)
    unet = {**sizes(stable_diffusion.__file__)["unet"], "in_channels": 9}
    inpainting.unet = seeded(diffusers.UNet2DConditionModel, **unet).eval()
    inpainting.set_progress_bar_config(disable=True)
    loaded["stable-diffusion+inpainting-unet"] = inpainting
    return loaded


def derived(pipe: Any, task: Task) -> Any:
    """The family's pipeline for ``task``, as the runner derives it."""
    if task is Task.TEXT_TO_IMAGE:
        return pipe
    out = getattr(diffusers, DERIVED_PIPELINES[task]).from_pipe(pipe)
    out.set_progress_bar_config(disable=True)
    return out


def reference(pipe: Any, side: int, case: Case) -> Reference:
    """The family's own pipeline call for ``case`` alone: its final latents and its image."""
    final: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        final[:] = [tensors["latents"].clone()]
        return tensors

    call = derived(pipe, case.task)
    kwargs: dict[str, Any] = {}
    if case.negative is not None:
        kwargs["negative_prompt"] = [case.negative]
    if case.task.needs_image:
        image, mask = inputs(side, case.seed)
        kwargs.update(image=[image], strength=0.8 if case.strength is None else case.strength)
        if case.task is Task.INPAINT:
            kwargs["mask_image"] = [mask]
    if "width" in inspect.signature(call.__call__).parameters:
        kwargs.update(width=side, height=side)
    images = call(
        prompt=[case.prompt],
        generator=[torch.Generator().manual_seed(case.seed)],
        num_inference_steps=case.steps,
        guidance_scale=case.guidance,
        output_type="pil",
        callback_on_step_end=keep,
        **kwargs,
    ).images
    return Reference(final[0], np.asarray(images[0], dtype=np.int16))


def tasks_of(variant: str) -> list[Case]:
    """The image cases a variant runs (a 9-channel UNet inpaints only)."""
    if variant.endswith("inpainting-unet"):
        return [INPAINT, INPAINT_FULL]
    return [I2I, I2I_STRONG, INPAINT, INPAINT_FULL]


@pytest.mark.parametrize("variant", SIZES)
def test_an_image_row_alone_is_the_pipeline_call_bit_for_bit(pipes: dict[str, Any], variant: str) -> None:
    pipe, side = pipes[variant], SIZES[variant]
    for case in tasks_of(variant):
        engine = StepEngine(pipe, side, side)
        with denoiser_calls(engine) as sizes_seen:
            finished, _ = run(engine, {0: [case.row("solo", side)]})
        assert len(sizes_seen) == case.denoised, f"{case.task} {case.strength}: its strength's steps only"
        expected = reference(pipe, side, case)
        done = finished["solo/0"]
        assert torch.equal(done.latents, expected.latents), f"{variant} {case.task} {case.strength}"
        (image,) = engine.decode([done])
        assert np.array_equal(np.asarray(image, dtype=np.int16), expected.pixels)


@pytest.mark.parametrize("variant", ["stable-diffusion", "stable-diffusion-xl"])
def test_text_image_and_inpainting_rows_of_other_strengths_share_a_set(pipes: dict[str, Any], variant: str) -> None:
    """Text-to-image, image-to-image at two strengths and inpainting at two: some start together, others join
    mid-flight; each equals its solo call within the tolerances."""
    pipe, side = pipes[variant], SIZES[variant]
    cases = {"t": TEXT, "a": I2I, "b": I2I_STRONG, "c": INPAINT, "d": INPAINT_FULL}
    joins = {0: ["t", "a", "c"], 1: ["b", "d"]}
    engine = StepEngine(pipe, side, side)
    with denoiser_calls(engine) as sizes_seen:
        finished, _ = run(engine, {k: [cases[name].row(name, side) for name in names] for k, names in joins.items()})
    assert max(sizes_seen) > 2, "the rows shared steps"
    for name, case in cases.items():
        assert_matches(engine, finished[f"{name}/0"], reference(pipe, side, case))


def test_inpainting_rows_share_a_set_on_an_inpainting_unet(pipes: dict[str, Any]) -> None:
    variant = "stable-diffusion+inpainting-unet"
    pipe, side = pipes[variant], SIZES[variant]
    engine = StepEngine(pipe, side, side)
    finished, _ = run(engine, {0: [INPAINT.row("c", side)], 1: [INPAINT_FULL.row("d", side)]})
    assert_matches(engine, finished["c/0"], reference(pipe, side, INPAINT))
    assert_matches(engine, finished["d/0"], reference(pipe, side, INPAINT_FULL))


@pytest.fixture(scope="module")
def lora_pipe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, LoraActivator]:
    """The SD demo pipeline with an activator over two random LoRA adapters of its UNet."""
    cache = Path(tmp_path_factory.mktemp("step-engine-lora"))
    source = ensure_demo_model(cache / "models", "stable-diffusion")
    for name, seed in (("ink", 1), ("oil", 2)):
        make_family_lora(source, cache / "loras", name, seed)
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(source))
    pipe.set_progress_bar_config(disable=True)
    return pipe, LoraActivator(pipe, cache / "loras")


def test_rows_of_two_adapters_and_none_share_a_set(lora_pipe: tuple[Any, LoraActivator]) -> None:
    pipe, loras = lora_pipe
    side = SIZES["stable-diffusion"]
    ink, oil = LoraRef(name="ink"), LoraRef(name="oil", scale=0.7)
    cases = {
        "i": replace(TEXT, lora=ink),
        "o": replace(I2I, lora=oil),
        "n": Case("a tree", steps=4, guidance=1.0, seed=26),
        "p": replace(INPAINT, lora=ink),
    }
    engine = StepEngine(pipe, side, side, loras=loras)
    with denoiser_calls(engine) as sizes_seen:
        finished, _ = run(engine, {0: [cases[k].row(k, side) for k in "ion"], 1: [cases["p"].row("p", side)]})
    assert max(sizes_seen) == 2 + 2 + 1 + 2, "one denoiser call of every row, whatever its adapter"
    solos: dict[str, Reference] = {}
    for name, case in cases.items():
        loras.activate(case.lora)
        solos[name] = reference(pipe, side, case)
    loras.activate(None)
    for name in cases:
        assert_matches(engine, finished[f"{name}/0"], solos[name])
    loras.activate(ink)
    inked = reference(pipe, side, replace(cases["n"], lora=ink))
    loras.activate(None)
    assert not torch.equal(inked.latents, solos["n"].latents), "the adapter changes the row: the test can fail"


def test_a_pipeline_that_cannot_mix_adapters_steps_once_per_adapter(
    lora_pipe: tuple[Any, LoraActivator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the LoRA layers cannot take one adapter per batch row (``LoraMixingError``), a join encodes the
    prompts once per adapter and each step calls the denoiser once per adapter; every row still equals its solo
    run."""
    pipe, loras = lora_pipe
    side = SIZES["stable-diffusion"]

    @contextmanager
    def cannot_mix(names: Sequence[LoraRef | None]) -> Iterator[None]:
        raise LoraMixingError("this pipeline's layers take one adapter per call")
        yield  # pragma: no cover

    monkeypatch.setattr(loras, "mixed", cannot_mix)
    ink = LoraRef(name="ink")
    cases = {"i": replace(TEXT, lora=ink), "n": replace(TEXT, prompt="a mill", seed=27), "o": replace(I2I, lora=ink)}
    engine = StepEngine(pipe, side, side, loras=loras)
    with denoiser_calls(engine) as sizes_seen:
        finished, _ = run(engine, {0: [cases[k].row(k, side) for k in "in"], 1: [cases["o"].row("o", side)]})
    assert not engine.mixes_loras
    assert sizes_seen[:2] == [2, 2], "step 0: one call per adapter (i; n)"
    assert sizes_seen[2:4] == [4, 2], "step 1: i and o together (one adapter); n"
    for name, case in cases.items():
        loras.activate(case.lora)
        assert_matches(engine, finished[f"{name}/0"], reference(pipe, side, case))
    loras.activate(None)


def test_what_the_engine_refuses(pipes: dict[str, Any], lora_pipe: tuple[Any, LoraActivator]) -> None:
    side = SIZES["stable-diffusion"]
    engine = StepEngine(pipes["stable-diffusion"], side, side)
    with pytest.raises(ValueError, match="image"):
        engine.join([replace(I2I.row("x", side), image=None)])
    with pytest.raises(ValueError, match="mask"):
        engine.join([replace(INPAINT.row("x", side), mask=None)])
    with pytest.raises(ValueError, match="strength"):
        engine.join([replace(I2I.row("x", side), strength=0.1)])  # int(4 x 0.1) = 0 steps
    with pytest.raises(ValueError, match="lora"):
        engine.join([replace(TEXT.row("x", side), lora=LoraRef(name="ink"))])  # no activator
    assert len(engine) == 0
