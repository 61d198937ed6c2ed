"""The step engine's adapters for SDXL, PixArt-Sigma, Flux, Sana, Qwen-Image and LTX-Video (9-frame videos), on
their tiny demo pipelines saved and loaded through ``from_pretrained`` as the worker loads them (float32, CPU), and
Flux with a guidance embedding (Flux-dev-like: the demo's transformer has none).

The same claims as ``tests/unit/test_step_engine.py`` makes for Stable Diffusion 1.x/2.x and SD3, per family:

* a row run alone equals the standard pipeline call (with the family's fixed call arguments, as the request-level
  runner calls it) bit for bit, guided with and without a negative prompt and unguided (within the tolerances for a
  true-CFG row: its pipeline makes the negative half a second transformer call);
* rows with different step counts, guidance scales and negative prompts share each step (one denoiser call over 2
  rows per guided row and 1 per unguided row; for Flux and Qwen-Image a row is guided by its negative prompt with its
  own true CFG scale, Flux's guidance scale is an embedding per row) and equal their solo calls within the
  tolerances;
* a row joining mid-flight and the peers of an aborted row equal their solo calls within the tolerances.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
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
from gpu_worker.runner import Video  # noqa: E402
from gpu_worker.step_engine import ADAPTERS, Finished, Row, StepEngine, supports  # noqa: E402
from shared.compat import step_key  # noqa: E402
from shared.contracts import Task  # noqa: E402
from tests.unit.test_step_engine import (  # noqa: E402
    GUIDED,
    MIXED,
    UNGUIDED,
    Case,
    Reference,
    assert_matches,
    denoiser_calls,
    pixels,
    run,
    spec,
)

SIZES = {"stable-diffusion-xl": 32, "pixart": 16, "flux": 32, "sana": 32, "qwen-image": 16, "ltx-video": 32}
"""The image side each family's test runs at (a multiple of its size multiple; small latents)."""
FRAMES = {"ltx-video": 9}
"""The frames of a video family's test (the step key's ``num_frames``)."""
VARIANTS = [*SIZES, "flux+guidance"]
"""Each family's demo pipeline, and Flux with a guidance-embedding transformer."""
TRUE_CFG = {"flux", "qwen-image"}
"""The families whose rows are guided by their negative prompt with their own true CFG scale."""

GUIDED_BY_DEFAULT = Case("a cat on a mat", steps=3, guidance=4.0, seed=3)
"""A guided row without a negative prompt: SDXL guides it by zeros (force_zeros_for_empty_prompt), PixArt by ''."""


@dataclass(frozen=True)
class TrueCfgCase(Case):
    """A row with its own true CFG scale (Flux, Qwen-Image; None: the pipeline's default)."""

    true_cfg: float | None = None

    def row(self, request_id: str) -> Row:
        return replace(super().row(request_id), true_cfg_scale=self.true_cfg)


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


def engine_of(pipes: dict[str, Any], variant: str) -> StepEngine:
    """An empty engine on ``variant``'s pipeline at its test's size (and frames)."""
    side = side_of(variant)
    return StepEngine(pipes[variant], side, side, num_frames=FRAMES.get(variant))


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
    if isinstance(case, TrueCfgCase) and case.true_cfg is not None:
        kwargs["true_cfg_scale"] = case.true_cfg
    if family_of(pipe).name in FRAMES:
        kwargs["num_frames"] = FRAMES[family_of(pipe).name]
    result = pipe(
        prompt=[case.prompt],
        generator=[torch.Generator().manual_seed(case.seed)],
        num_inference_steps=case.steps,
        guidance_scale=case.guidance,
        width=side,
        height=side,
        output_type="pil",
        **kwargs,
    )
    frames = getattr(result, "frames", None)
    output = result.images[0] if frames is None else Video(frames=frames[0], fps=0)
    return Reference(final[0], pixels(output))


def solo_is_exact(variant: str, guided: bool) -> bool:
    """Whether a row alone computes what its pipeline call computes, operation for operation: not a true-CFG row
    (the pipeline's negative half is a second transformer call, the engine's is in the one call) nor an unguided
    LTX-Video row (the pipeline feeds the transformer its packed latents as a non-contiguous view, the engine a
    contiguous batch: another matmul reduction order, ~1e-7)."""
    family = variant.partition("+")[0]
    return not (family in TRUE_CFG and guided) and not (family == "ltx-video" and not guided)


@pytest.mark.parametrize("family", SIZES)
def test_the_family_has_an_adapter(pipes: dict[str, Any], family: str) -> None:
    assert family in ADAPTERS and supports(pipes[family])
    assert family_of(pipes[family]).name == family


@pytest.mark.parametrize("family", VARIANTS)
def test_a_row_alone_is_the_pipeline_call_bit_for_bit(pipes: dict[str, Any], family: str) -> None:
    pipe, side = pipes[family], side_of(family)
    for case in (GUIDED, GUIDED_BY_DEFAULT, UNGUIDED):
        engine = engine_of(pipes, family)
        finished, at = run(engine, {0: [case.row("solo")]})
        expected = reference(pipe, side, case)
        done = finished["solo/0"]
        assert at["solo/0"] == case.steps
        if not solo_is_exact(family, engine.adapter.guided(case.row("solo"))):
            assert_matches(engine, done, expected)
            continue
        assert torch.equal(done.latents, expected.latents), f"{family}: {case} differs from the pipeline"
        (output,) = engine.decode([done])
        assert np.array_equal(pixels(output), expected.pixels)


@pytest.mark.parametrize("family", VARIANTS)
def test_different_step_counts_guidance_and_negatives_share_each_step(pipes: dict[str, Any], family: str) -> None:
    pipe, side = pipes[family], side_of(family)
    cases = [*MIXED, GUIDED_BY_DEFAULT]
    engine = engine_of(pipes, family)
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
    outputs = engine.decode([finished[f"r{i}/0"] for i in range(len(cases))])  # one batched decode
    assert len({pixels(output).tobytes() for output in outputs}) == len(cases), "rows are not distinct"
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
    engine = engine_of(pipes, family)
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
    with pytest.raises(ValueError, match="task"):  # PixArt's rows are text-to-image only
        StepEngine.for_key(pipes["pixart"], step_key(spec(task=Task.INPAINT, strength=0.5)))
    transformer = pipes["pixart"].transformer
    transformer.use_additional_conditions = True  # PixArt-Alpha 1024's resolution and aspect-ratio conditions
    try:
        with pytest.raises(ValueError, match="resolution conditions"):
            StepEngine(pipes["pixart"], 16, 16)
    finally:
        transformer.use_additional_conditions = False


@pytest.mark.parametrize("family", sorted(TRUE_CFG))
def test_rows_carry_their_own_true_cfg_scale(pipes: dict[str, Any], family: str) -> None:
    """Rows guided by their negative prompts at their own true CFG scales, one at the pipeline's default, and rows
    the pipeline leaves unguided (no negative prompt; a scale of 1) share each step and equal their solo calls."""
    pipe, side = pipes[family], side_of(family)
    cases = [
        TrueCfgCase("a red fox", steps=3, guidance=3.5, seed=31, negative="blurry", true_cfg=2.5),
        TrueCfgCase("a blue whale", steps=4, guidance=3.5, seed=32, negative="a boat", true_cfg=6.0),
        TrueCfgCase("a lighthouse", steps=2, guidance=3.5, seed=33, negative="fog", true_cfg=1.0),
        TrueCfgCase("a tree", steps=3, guidance=3.5, seed=34, true_cfg=4.0),
        TrueCfgCase("an owl", steps=3, guidance=3.5, seed=35, negative="day"),
    ]
    engine = engine_of(pipes, family)
    guided = [engine.adapter.guided(case.row("count")) for case in cases]
    assert guided == [True, True, False, False, family == "qwen-image"], "the pipeline's do_true_cfg, per row"
    engine.join([case.row(f"r{i}") for i, case in enumerate(cases)])
    finished: dict[str, Finished] = {}
    with denoiser_calls(engine) as calls:
        while len(engine):
            finished.update((done.row.id, done) for done in engine.step())
    assert calls[0] == len(cases) + sum(guided), "the guided rows' negative halves in the one call"
    for i, case in enumerate(cases):
        assert_matches(engine, finished[f"r{i}/0"], reference(pipe, side, case))
