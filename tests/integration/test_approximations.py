"""The approximate accelerations on the tiny pipelines through the real runner (``gpu_worker.approximations``):
each setting changes a request's pixels by no more than ``DOCUMENTED_DEVIATION`` (docs/models.md) and by something
(it is really on); the fixed-schedule step caches keep a row equal to its solo run; with everything off nothing is
touched and outputs are bit-identical; bad values are errors naming the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from bench.families import family_inputs, family_specs, pixels
from demo_models import ensure_demo_model
from gpu_worker.approximations import DOCUMENTED_DEVIATION, quantize_weights
from gpu_worker.diffusers_runner import DiffusersRunner
from shared.settings import Settings

pytestmark = pytest.mark.timeout(600)

STEPS = 8
"""Enough steps for every cache to skip some (TaylorSeer computes its first three in full)."""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("approximation-models")


def _runner(family: str, cache: Path, **settings: Any) -> DiffusersRunner:
    ensure_demo_model(cache, family)
    return DiffusersRunner(Settings(model=None, demo_family=family, model_cache_dir=cache, **settings))


def _run(runner: DiffusersRunner, prompts: list[str], first_seed: int = 11) -> list[np.ndarray]:
    family = runner.family.name
    specs = family_specs(family, prompts, side=32, steps=STEPS, seed=first_seed, negative="blurry")
    outputs = runner.run(specs, lambda step, total: False, family_inputs(specs))
    return [pixels(request[0]).astype(np.int16) for request in outputs]


def _deviation(a: list[np.ndarray], b: list[np.ndarray]) -> int:
    return max(int(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


PROMPTS = ["a red fox", "a blue whale"]


@pytest.mark.parametrize(
    ("family", "setting", "value"),
    [
        ("stable-diffusion", "step_cache", "deepcache:3"),
        ("flux", "step_cache", "taylorseer:3"),
        ("stable-diffusion-3", "step_cache", "taylorseer:3"),  # no CacheMixin: the hook put on directly
        ("flux", "step_cache", "first_block:0.9"),
        ("stable-diffusion", "weight_quantization", "int8_weight"),
        ("stable-diffusion", "weight_quantization", "fp8_weight"),
    ],
)
def test_each_approximation_deviates_no_more_than_documented(
    family: str, setting: str, value: str, cache_dir: Path
) -> None:
    exact = _run(_runner(family, cache_dir), PROMPTS)
    runner = _runner(family, cache_dir, **{setting: value})
    assert runner.approximations.any, f"{setting}={value} was not applied to {family}"
    deviation = _deviation(exact, _run(runner, PROMPTS))
    method = value.split(":")[0]
    assert 0 < deviation <= DOCUMENTED_DEVIATION[method], f"{family} {setting}={value}: {deviation}/255"


@pytest.mark.parametrize(("family", "value"), [("stable-diffusion", "deepcache:3"), ("flux", "taylorseer:3")])
def test_a_fixed_schedule_cache_keeps_each_row_equal_to_its_solo_run(family: str, value: str, cache_dir: Path) -> None:
    runner = _runner(family, cache_dir, step_cache=value)
    assert runner.approximations.peer_independent
    fused = _run(runner, PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        (alone,) = _run(runner, [prompt], first_seed=11 + i)
        assert _deviation([fused[i]], [alone]) <= 1, f"{value}: row {i} depends on its peer"


@pytest.mark.parametrize(
    ("family", "value"),
    [("stable-diffusion", "deepcache:3"), ("stable-diffusion-3", "taylorseer:3"), ("flux", "first_block:0.9")],
)
def test_a_step_caches_state_starts_afresh_at_every_call(family: str, value: str, cache_dir: Path) -> None:
    runner = _runner(family, cache_dir, step_cache=value)
    first = _run(runner, PROMPTS)
    assert _deviation(first, _run(runner, PROMPTS)) == 0, f"{value}: the second call reused the first's cache"


def test_the_first_block_cache_says_rows_may_depend_on_their_peers(cache_dir: Path) -> None:
    runner = _runner("flux", cache_dir, step_cache="first_block:0.9")
    assert not runner.approximations.peer_independent
    assert "may depend on its peers" in runner.approximations.describe()
    assert runner.traits.approximate == runner.approximations.describe()  # announced: fusefleet status shows it


def test_off_touches_nothing_and_outputs_are_bit_identical(cache_dir: Path) -> None:
    default = _runner("stable-diffusion", cache_dir)
    off = _runner("stable-diffusion", cache_dir, step_cache="off", weight_quantization="off")
    assert not off.approximations.any and off.approximations.describe() == "exact"
    assert off.traits == default.traits and off.traits.approximate is None
    assert all("forward" not in vars(block) for block in off.pipe.unet.down_blocks)  # no cache wrapper
    assert all(type(m) is not torch.nn.Linear or "weight" in m._parameters for m in off.pipe.unet.modules())
    assert _deviation(_run(default, PROMPTS), _run(off, PROMPTS)) == 0


def test_a_step_cache_that_fits_no_denoiser_leaves_the_model_exact(cache_dir: Path) -> None:
    runner = _runner("stable-diffusion", cache_dir, step_cache="taylorseer:3,first_block:0.1")
    assert runner.approximations.step_cache is None and runner.step_mode  # a UNet: exact, still in step mode
    cached = _runner("stable-diffusion", cache_dir, step_cache="taylorseer:3,deepcache:2")
    assert str(cached.approximations.step_cache) == "deepcache:2" and not cached.step_mode  # the first that fits
    assert cached.traits.step_tasks == () and runner.traits.step_tasks  # announced: no step-mode rows


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"step_cache": "deepcache:1"}, "step_cache: 'deepcache:1': the interval of deepcache"),
        ({"step_cache": "teacache:0.1"}, "step_cache: 'teacache:0.1' is not one of off, deepcache"),
        ({"step_cache": "first_block:1.5"}, "the threshold of first_block is between 0 and 1"),
        ({"weight_quantization": "int4"}, "weight_quantization"),
    ],
)
def test_bad_values_are_errors_naming_the_setting(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**settings)


def test_fp8_matmuls_are_refused_off_a_recent_cuda_gpu(cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="weight_quantization=fp8 needs a CUDA GPU of compute capability 8.9"):
        quantize_weights(object(), "fp8", torch.device("cpu"))


@pytest.mark.soak  # ~100 s on two CPU cores: inductor compiles Flux's blocks around the hooks
def test_a_compiled_denoiser_takes_a_step_cache_and_changes_nothing_more(cache_dir: Path, tmp_path: Path) -> None:
    eager = _run(_runner("flux", cache_dir, step_cache="taylorseer:3"), PROMPTS)
    compiled = _runner(
        "flux",
        cache_dir,
        step_cache="taylorseer:3",
        compile_denoiser=True,
        compile_cache_dir=tmp_path / "inductor",
        max_num_seqs=2,
    )
    assert _deviation(eager, _run(compiled, PROMPTS)) <= 1
