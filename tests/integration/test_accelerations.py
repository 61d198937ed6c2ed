"""The exact accelerations on the tiny pipelines through the real runner: a forward padded up to its batch bucket
gives each request what it gets unpadded (within 1/255) and the padding rows never reach a result, for every
family; every family's denoiser compiles as one graph per block (dynamo, the ``aot_eager`` backend: the tracing
and bucketing without inductor's code generation) and its padded, fused rows equal their compiled solo runs within
1/255; a UNet of several block widths takes every bucket (the recompile limit); with inductor (soak), a compiled
denoiser's fused rows equal their compiled solo runs, and the eager ones, within 1/255."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from bench.families import family_inputs, family_runner, family_specs, pixels
from gpu_worker.accelerations import compile_denoiser, use_channels_last
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.families import FAMILIES
from shared.settings import Settings

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("acceleration-models")


def _specs(family: str, prompts: list[str]) -> Any:
    extra = {"max_sequence_length": 32} if FAMILIES[family].traits.max_sequence_length is not None else {}
    return family_specs(family, prompts, side=32, steps=2, seed=11, negative="blurry {i}", **extra)


def _run(runner: DiffusersRunner, specs: Any) -> list[list[np.ndarray]]:
    outputs = runner.run(specs, lambda step, total: False, family_inputs(specs))
    return [[pixels(output) for output in request] for request in outputs]


def _close(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_padded_forward_equals_the_unpadded_and_drops_its_padding(family: str, cache_dir: Path) -> None:
    runner = family_runner(family, cache_dir)
    specs = _specs(family, ["a red fox", "a blue whale"])
    plain = _run(runner, specs)
    runner.buckets = (4,)  # two rows padded to four
    padded = _run(runner, specs)
    assert [len(images) for images in padded] == [1, 1]  # the padding rows' outputs are in no result
    for alone, bucketed in zip(plain, padded, strict=True):
        assert _close(alone[0], bucketed[0]) <= 1, f"{family}: padding changed a row"


def test_channels_last_and_a_pinned_attention_backend_change_nothing(cache_dir: Path) -> None:
    stock = family_runner("stable-diffusion", cache_dir)
    fast = DiffusersRunner(
        Settings(model=None, model_cache_dir=cache_dir, channels_last=True, sdpa_backend="math")
    )
    specs = _specs("stable-diffusion", ["a red fox", "a blue whale"])
    for a, b in zip(_run(stock, specs), _run(fast, specs), strict=True):
        assert _close(a[0], b[0]) <= 1


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """dynamo without the graphs of earlier tests, at its default recompile limit (restored after)."""
    import torch._dynamo.config as dynamo

    torch._dynamo.reset()
    with dynamo.patch(recompile_limit=8, accumulated_recompile_limit=256):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_compiled_denoiser_traces_whole_blocks_and_its_padded_rows_equal_their_solo_runs(
    family: str, cache_dir: Path, fresh_dynamo: None
) -> None:
    runner = family_runner(family, cache_dir)
    assert compile_denoiser(runner.pipe, None, backend="aot_eager"), f"{family}: nothing compiled"
    runner.buckets = (1, 2, 4)  # three rows padded to four, one row alone
    specs = _specs(family, ["a red fox", "a blue whale", "a green frog"])
    fused = _run(runner, specs)  # fullgraph: a graph break in a block raises here
    assert [len(images) for images in fused] == [1, 1, 1]
    for spec, images in zip(specs, fused, strict=True):
        (alone,) = _run(runner, [spec])
        assert _close(images[0], alone[0]) <= 1, f"{family}: a compiled, padded row differs from its solo run"


def test_a_compiled_unet_of_several_block_widths_takes_every_bucket(fresh_dynamo: None) -> None:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    # three attention widths, as SD's UNet has four: 3 widths x 5 buckets = 15 graphs of one code object > 8
    unet: Any = UNet2DConditionModel(  # type: ignore[no-untyped-call,attr-defined]
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    ).eval()
    inputs = {batch: (torch.randn(batch, 4, 16, 16), torch.randn(batch, 7, 32)) for batch in (1, 2, 4, 8, 16)}
    with torch.no_grad():
        eager = {batch: unet(sample, 10, text).sample for batch, (sample, text) in inputs.items()}
        assert compile_denoiser(SimpleNamespace(unet=unet), None, backend="aot_eager") == ["unet"]
        for batch, (sample, text) in inputs.items():  # with dynamo's default limit of 8, fullgraph fails at 4
            assert torch.allclose(unet(sample, 10, text).sample, eager[batch], atol=1e-5), batch


@pytest.mark.soak  # ~50 s per family on two CPU cores: inductor compiles the blocks for two buckets
@pytest.mark.parametrize("family", ["stable-diffusion", "flux"])
def test_a_compiled_denoiser_equals_its_solo_runs_and_the_eager_one(
    family: str, cache_dir: Path, tmp_path: Path
) -> None:
    eager = family_runner(family, cache_dir)
    settings = Settings(
        model=None,
        demo_family=family,
        model_cache_dir=cache_dir,
        compile_denoiser=True,
        compile_cache_dir=tmp_path / "inductor",
        max_num_seqs=2,
    )
    compiled = DiffusersRunner(settings)
    assert compiled.buckets == (1, 2)
    specs = _specs(family, ["a red fox", "a blue whale"])
    fused = _run(compiled, specs)
    reference = _run(eager, specs)
    for spec, images, stock in zip(specs, fused, reference, strict=True):
        (alone,) = _run(compiled, [spec])
        assert _close(images[0], alone[0]) <= 1, "compiled: fused differs from solo"
        assert _close(images[0], stock[0]) <= 1, "compiled differs from eager"


@pytest.mark.parametrize("family", ["stable-diffusion", "flux", "wan"])
def test_channels_last_takes_the_2d_convolutional_components_only(family: str, cache_dir: Path) -> None:
    runner = family_runner(family, cache_dir)
    assert use_channels_last(runner.pipe) == {"stable-diffusion": ["unet", "vae"], "flux": ["vae"], "wan": []}[family]
