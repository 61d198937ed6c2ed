"""Every pipeline family through the real runner (``DiffusersRunner``) on its tiny random-weight demo pipeline,
saved and loaded back through ``from_pretrained``: the family is recognised, its traits announced, a fused batch
equals each request run alone within 1/255, and requests of different sizes never share a call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.families import family_inputs, family_runner, family_specs, pixels
from demo_models import DEMO_FAMILIES, ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner, check_batch
from gpu_worker.families import FAMILIES
from gpu_worker.step_engine import step_tasks, supports
from shared.contracts import LoraRef, RequestSpec
from shared.settings import Settings
from tests.support.lora import make_family_lora

pytestmark = pytest.mark.timeout(600)

PIPELINES = {
    "stable-diffusion": "StableDiffusionPipeline",
    "stable-diffusion-xl": "StableDiffusionXLPipeline",
    "stable-diffusion-3": "StableDiffusion3Pipeline",
    "flux": "FluxPipeline",
    "pixart": "PixArtSigmaPipeline",
    "sana": "SanaPipeline",
    "qwen-image": "QwenImagePipeline",
    "ltx-video": "LTXPipeline",
    "wan": "WanPipeline",
    "wan-i2v": "WanImageToVideoPipeline",
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family-models")


def specs_for(family: str, prompts: Sequence[str], side: int, **extra: Any) -> list[RequestSpec]:
    """``bench.families.family_specs`` at 2 steps, each with its own negative prompt (``max_sequence_length`` 32
    where the family has one)."""
    if FAMILIES[family].traits.max_sequence_length is not None:
        extra = {"max_sequence_length": 32, **extra}
    return family_specs(family, prompts, side=side, steps=2, seed=100, negative="blurry {i}", **extra)


def test_every_family_has_a_demo_and_a_test() -> None:
    assert set(DEMO_FAMILIES) == set(FAMILIES) == set(PIPELINES)


@pytest.mark.parametrize("family", list(PIPELINES))
def test_fused_equals_solo(family: str, cache_dir: Path) -> None:
    runner = family_runner(family, cache_dir)
    assert runner.pipeline_name == PIPELINES[family]
    # the family's traits, with what the loaded pipeline tells: LoRA loads, and its step-engine adapter's row tasks
    tasks = step_tasks(runner.pipe)
    assert bool(tasks) == supports(runner.pipe)  # a family with a step-mode adapter says what its rows carry
    expected = FAMILIES[family].traits.model_copy(update={"lora": family != "pixart", "step_tasks": tasks})
    assert runner.traits == expected and runner.fused
    specs = specs_for(family, ["a red fox", "a blue whale in the sea", "a lighthouse"], side=32)
    inputs = family_inputs(specs)  # an image-to-video model's requests each bring their first frame
    fused = runner.run(specs, lambda step, total: False, inputs)
    assert [len(outputs) for outputs in fused] == [1, 1, 1]
    first = pixels(fused[0][0])
    assert any(np.abs(first - pixels(outputs[0])).max() > 1 for outputs in fused[1:]), "rows are not distinct"
    for spec, outputs in zip(specs, fused, strict=True):
        (alone,) = runner.run([spec], lambda step, total: False, inputs)
        difference = np.abs(pixels(outputs[0]) - pixels(alone[0])).max()
        assert difference <= 1, f"{family}: {spec.id} differs fused vs solo by {difference}/255"


@pytest.mark.parametrize("family", ["stable-diffusion-3", "flux", "sana", "qwen-image"])  # sana, qwen: see the runner
def test_two_outputs_per_request_keep_their_own_generators(family: str, cache_dir: Path) -> None:
    runner = family_runner(family, cache_dir)
    specs = specs_for(family, ["a red fox", "a blue whale"], side=32, n=2)
    fused = runner.run(specs, lambda step, total: False)
    for spec, outputs in zip(specs, fused, strict=True):
        alone = runner.run([spec], lambda step, total: False)[0]
        assert len(outputs) == len(alone) == 2
        for mine, solo in zip(outputs, alone, strict=True):
            assert np.abs(pixels(mine) - pixels(solo)).max() <= 1


def test_different_sizes_never_share_a_call() -> None:
    small, large = specs_for("flux", ["a"], side=32)[0], specs_for("flux", ["b"], side=48)[0]
    with pytest.raises(ValueError, match="width"):
        check_batch([small, large])


LORA_FAMILIES = ["stable-diffusion-xl", "stable-diffusion-3", "flux", "sana", "qwen-image", "ltx-video", "wan"]


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_a_lora_changes_the_output_and_stays_fused_equal_solo(family: str, cache_dir: Path, tmp_path: Path) -> None:
    model_dir = ensure_demo_model(cache_dir, family)
    make_family_lora(model_dir, tmp_path, "style", seed=3)
    runner = DiffusersRunner(
        Settings(model=None, demo_family=family, model_cache_dir=cache_dir, lora_dir=tmp_path)
    )
    plain = specs_for(family, ["a red fox", "a blue whale"], side=32)
    styled = specs_for(family, ["a red fox", "a blue whale"], side=32, lora=LoraRef(name="style", scale=1.0))
    without = runner.run(plain, lambda step, total: False)
    fused = runner.run(styled, lambda step, total: False)
    assert np.abs(pixels(fused[0][0]) - pixels(without[0][0])).max() > 1, f"{family}: the LoRA changed nothing"
    for spec, outputs in zip(styled, fused, strict=True):
        (alone,) = runner.run([spec], lambda step, total: False)
        assert np.abs(pixels(outputs[0]) - pixels(alone[0])).max() <= 1, f"{family}: {spec.id} fused != solo"
    again = runner.run(plain, lambda step, total: False)  # no LoRA: the bare model again
    assert np.abs(pixels(again[0][0]) - pixels(without[0][0])).max() <= 1
