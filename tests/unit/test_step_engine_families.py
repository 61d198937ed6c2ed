"""The step engine's adapters for SDXL, PixArt-Sigma, Flux and Sana, on their tiny demo pipelines saved and loaded
through ``from_pretrained`` as the worker loads them (float32, CPU), and Flux with a guidance embedding (Flux-dev-like:
the demo's transformer has none).

The same claims as ``tests/unit/test_step_engine.py`` makes for Stable Diffusion 1.x/2.x and SD3, per family:

* a row run alone equals the standard pipeline call (with the family's fixed call arguments, as the request-level
  runner calls it) bit for bit, guided with and without a negative prompt and unguided;
* rows with different step counts, guidance scales and negative prompts share each step (one denoiser call over 2
  rows per guided row and 1 per unguided row; 1 per row for Flux, whose guidance is an embedding per row) and equal
  their solo calls within the tolerances;
* a row joining mid-flight and the peers of an aborted row equal their solo calls within the tolerances.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model, flux  # noqa: E402
from demo_models.components import seeded, sizes  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.families import family_of  # noqa: E402
from gpu_worker.step_engine import ADAPTERS, Finished, StepEngine, supports  # noqa: E402
from tests.unit.test_step_engine import (  # noqa: E402
    GUIDED,
    MIXED,
    UNGUIDED,
    Case,
    Reference,
    assert_matches,
    denoiser_calls,
    run,
)

SIZES = {"stable-diffusion-xl": 32, "pixart": 16, "flux": 32, "sana": 32}
"""The image side each family's test runs at (a multiple of its size multiple; small latents)."""
VARIANTS = [*SIZES, "flux+guidance"]
"""Each family's demo pipeline, and Flux with a guidance-embedding transformer."""

GUIDED_BY_DEFAULT = Case("a cat on a mat", steps=3, guidance=4.0, seed=3)
"""A guided row without a negative prompt: SDXL guides it by zeros (force_zeros_for_empty_prompt), PixArt by ''."""

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def pipes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each family's demo pipeline, loaded as the worker loads it."""
    cache = tmp_path_factory.mktemp("step-engine-family-models")
    loaded: dict[str, Any] = {}
    for family in SIZES:
        source = str(ensure_demo_model(Path(cache), family))
        pipe = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
        pipe.set_progress_bar_config(disable=True)
        loaded[family] = pipe
    source = str(ensure_demo_model(Path(cache), "flux"))
    guided = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
    transformer = seeded(diffusers.FluxTransformer2DModel, **sizes(flux.__file__)["transformer"], guidance_embeds=True)
    guided.transformer = transformer.eval()
    guided.set_progress_bar_config(disable=True)
    loaded["flux+guidance"] = guided
    return loaded


def side_of(variant: str) -> int:
    return SIZES[variant.partition("+")[0]]


def batch_size(engine: StepEngine, cases: list[Case], steps_done: int) -> int:
    """The fused call's batch at a step: two halves per live row the adapter guides, one per other live row."""
    return sum(2 if engine.adapter.guided(case.row("count")) else 1 for case in cases if case.steps > steps_done)


def reference(pipe: Any, side: int, case: Case) -> Reference:
    """The pipeline call for ``case`` alone, with the family's fixed call arguments (``use_resolution_binning``,
    ``clean_caption``: what the request-level runner passes): its final latents and its image."""
    final: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        final[:] = [tensors["latents"].clone()]
        return tensors

    def keep_latents(step: int, timestep: Any, latents: torch.Tensor) -> None:  # the older callback (PixArt)
        final[:] = [latents.clone()]

    accepts = inspect.signature(pipe.__call__).parameters
    kwargs: dict[str, Any] = {name: value for name, value in family_of(pipe).fixed_kwargs.items() if name in accepts}
    if "callback_on_step_end" in accepts:
        kwargs["callback_on_step_end"] = keep
    else:
        kwargs.update(callback=keep_latents, callback_steps=1)
    if case.negative is not None:
        kwargs["negative_prompt"] = [case.negative]
    if case.rescale and family_of(pipe).traits.guidance_rescale:
        kwargs["guidance_rescale"] = case.rescale
    images = pipe(
        prompt=[case.prompt],
        generator=[torch.Generator().manual_seed(case.seed)],
        num_inference_steps=case.steps,
        guidance_scale=case.guidance,
        width=side,
        height=side,
        output_type="pil",
        **kwargs,
    ).images
    return Reference(final[0], np.asarray(images[0], dtype=np.int16))


@pytest.mark.parametrize("family", SIZES)
def test_the_family_has_an_adapter(pipes: dict[str, Any], family: str) -> None:
    assert family in ADAPTERS and supports(pipes[family])
    assert family_of(pipes[family]).name == family


@pytest.mark.parametrize("family", VARIANTS)
def test_a_row_alone_is_the_pipeline_call_bit_for_bit(pipes: dict[str, Any], family: str) -> None:
    pipe, side = pipes[family], side_of(family)
    for case in (GUIDED, GUIDED_BY_DEFAULT, UNGUIDED):
        engine = StepEngine(pipe, side, side)
        finished, at = run(engine, {0: [case.row("solo")]})
        expected = reference(pipe, side, case)
        done = finished["solo/0"]
        assert at["solo/0"] == case.steps
        assert torch.equal(done.latents, expected.latents), f"{family}: {case} differs from the pipeline"
        (image,) = engine.decode([done])
        assert np.array_equal(np.asarray(image, dtype=np.int16), expected.pixels)


@pytest.mark.parametrize("family", VARIANTS)
def test_different_step_counts_guidance_and_negatives_share_each_step(pipes: dict[str, Any], family: str) -> None:
    pipe, side = pipes[family], side_of(family)
    cases = [*MIXED, GUIDED_BY_DEFAULT]
    engine = StepEngine(pipe, side, side)
    engine.join([case.row(f"r{i}") for i, case in enumerate(cases)])
    finished: dict[str, Finished] = {}
    at: dict[str, int] = {}
    with denoiser_calls(engine) as sizes:
        step = 0
        while len(engine):
            step += 1
            for done in engine.step():
                finished[done.row.id], at[done.row.id] = done, step
    assert sizes == [batch_size(engine, cases, done) for done in range(step)], "one denoiser call per step, every row"
    assert at == {f"r{i}/0": case.steps for i, case in enumerate(cases)}
    images = engine.decode([finished[f"r{i}/0"] for i in range(len(cases))])  # one batched decode
    assert len({image.tobytes() for image in images}) == len(cases), "rows are not distinct"
    for i, case in enumerate(cases):
        assert_matches(engine, finished[f"r{i}/0"], reference(pipe, side, case))


@pytest.mark.parametrize("family", VARIANTS)
def test_a_joiner_mid_flight_and_the_peers_of_an_aborted_row_equal_their_solo_runs(
    pipes: dict[str, Any], family: str
) -> None:
    pipe, side = pipes[family], side_of(family)
    first = Case("a red fox", steps=5, guidance=5.0, seed=21, negative="blurry")
    doomed = Case("a blue whale", steps=5, guidance=3.0, seed=22)
    joiner = Case("a lighthouse at night", steps=3, guidance=1.0, seed=23)
    engine = StepEngine(pipe, side, side)
    engine.join([first.row("a"), doomed.row("b")])
    with denoiser_calls(engine) as sizes:
        engine.step()
        engine.step()
        assert engine.abort("b/0") and engine.live == ("a/0",)
        finished, at = run(engine, {0: [joiner.row("c")]})
    pair, after = batch_size(engine, [first, doomed], 0), batch_size(engine, [first, joiner], 0)
    assert sizes == [pair, pair, after, after, after], "the aborted row's halves leave, the joiner's come in"
    assert at == {"a/0": 3, "c/0": 3} and sorted(finished) == ["a/0", "c/0"]
    assert_matches(engine, finished["a/0"], reference(pipe, side, first))
    assert_matches(engine, finished["c/0"], reference(pipe, side, joiner))


def test_flux_rows_carry_their_own_guidance_embedding(pipes: dict[str, Any]) -> None:
    pipe, side = pipes["flux+guidance"], side_of("flux")
    low, high = Case("a red fox", steps=3, guidance=1.5, seed=5), Case("a red fox", steps=3, guidance=6.0, seed=5)
    engine = StepEngine(pipe, side, side)
    finished, _ = run(engine, {0: [low.row("low"), high.row("high")]})
    assert not torch.equal(finished["low/0"].latents, finished["high/0"].latents), "guidance must reach the model"
    assert_matches(engine, finished["low/0"], reference(pipe, side, low))
    assert_matches(engine, finished["high/0"], reference(pipe, side, high))


def test_what_the_adapters_refuse(pipes: dict[str, Any]) -> None:
    for family, pipe in pipes.items():
        assert StepEngine(pipe, side_of(family), side_of(family)).adapter.size_multiple > 1
        with pytest.raises(ValueError, match="width"):
            StepEngine(pipe, side_of(family) + 1, side_of(family))
    transformer = pipes["pixart"].transformer
    transformer.use_additional_conditions = True  # PixArt-Alpha 1024's resolution and aspect-ratio conditions
    try:
        with pytest.raises(ValueError, match="resolution conditions"):
            StepEngine(pipes["pixart"], 16, 16)
    finally:
        transformer.use_additional_conditions = False
