"""The step engine (``gpu_worker.step_engine``) on the tiny Stable Diffusion 1.x and Stable Diffusion 3 demo
pipelines, saved and loaded through ``from_pretrained`` as the worker loads them (float32, CPU).

* a row run alone equals the standard pipeline call (same prompt, negative prompt, seed, steps, guidance) bit for
  bit, for several schedulers (DDIM, Euler, Euler ancestral, DPM-Solver++, v-prediction) and both families;
* rows in a running set (joined at other steps, with other step counts and guidance scales, beside an aborted row,
  after a failed step) equal their solo pipeline calls within ``PIXEL_TOLERANCE`` / ``LATENT_TOLERANCE``: only the
  denoiser's batch differs, and with it float rounding (docs/step_mode.md);
* every step is one denoiser call over 2 rows per guided row and 1 per unguided row.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from bench.step_engine import measure  # noqa: E402
from demo_models import ensure_demo_model, sd3  # noqa: E402
from demo_models.components import eval_modules  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.step_engine import (  # noqa: E402
    PER_ROW,
    Finished,
    Row,
    StepEngine,
    StepKey,
    UnsupportedPipeline,
    rows_of,
    step_key,
    step_tasks,
    supports,
)
from gpu_worker.torch_env import make_generators  # noqa: E402
from shared.compat import STEP_ONLY, CompatKey  # noqa: E402
from shared.contracts import LoraRef, RequestSpec, Task  # noqa: E402

PIXEL_TOLERANCE = 1
"""Largest difference (of 255) of a row's image from its solo pipeline call, in a running set."""
LATENT_TOLERANCE = 1e-4
"""Largest difference of a row's final latents from its solo pipeline call's, relative to their largest magnitude."""

SIZES = {"stable-diffusion": 32, "stable-diffusion-3": 16}


@dataclass(frozen=True)
class Case:
    """One row's parameters."""

    prompt: str
    steps: int
    guidance: float
    seed: int
    negative: str | None = None
    rescale: float = 0.0

    def row(self, request_id: str) -> Row:
        return Row(
            request_id=request_id,
            prompt=self.prompt,
            steps=self.steps,
            guidance_scale=self.guidance,
            generator=torch.Generator().manual_seed(self.seed),
            negative_prompt=self.negative,
            guidance_rescale=self.rescale,
        )


GUIDED = Case("a red fox", steps=4, guidance=5.0, seed=1, negative="blurry", rescale=0.7)
UNGUIDED = Case("a blue whale in the sea", steps=3, guidance=1.0, seed=2)
MIXED = [
    Case("a red fox", steps=4, guidance=5.0, seed=11, negative="blurry"),
    Case("a blue whale in the sea", steps=3, guidance=1.0, seed=12),
    Case("a lighthouse", steps=6, guidance=7.5, seed=13, rescale=0.7),
    Case("a tree", steps=2, guidance=2.0, seed=14, negative="a dog"),
]


@dataclass(frozen=True)
class Reference:
    """A solo pipeline call's final latents and image pixels."""

    latents: torch.Tensor
    pixels: np.ndarray


# --- pipelines --------------------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def pipes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo pipelines of both step-mode families, loaded as the worker loads them, and SD3 with T5."""
    cache = tmp_path_factory.mktemp("step-engine-models")
    loaded: dict[str, Any] = {}
    for family in SIZES:
        source = str(ensure_demo_model(Path(cache), family))
        pipe = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
        pipe.set_progress_bar_config(disable=True)
        loaded[family] = pipe
    with_t5 = eval_modules(sd3.build(with_t5=True))
    with_t5.set_progress_bar_config(disable=True)
    loaded["stable-diffusion-3+t5"] = with_t5
    return loaded


SCHEDULERS: dict[str, Callable[[Any], Any]] = {
    "ddim": lambda config: diffusers.DDIMScheduler.from_config(config),
    "euler": lambda config: diffusers.EulerDiscreteScheduler.from_config(config),
    "euler-ancestral": lambda config: diffusers.EulerAncestralDiscreteScheduler.from_config(config),
    "dpm": lambda config: diffusers.DPMSolverMultistepScheduler.from_config(config),
    "v-prediction": lambda config: diffusers.DDIMScheduler.from_config(
        config, prediction_type="v_prediction", rescale_betas_zero_snr=True, timestep_spacing="trailing"
    ),
}
"""Stable Diffusion schedulers under test: per-step noise from the row's generator (Euler ancestral), a
step-count dependent ``init_noise_sigma`` and input scaling (Euler), multistep history (DPM), SD 2.x v-prediction."""


@contextmanager
def setup(pipes: dict[str, Any], variant: str) -> Iterator[tuple[Any, int]]:
    """The pipeline of ``variant`` (``family`` or ``family:scheduler``) and its image side; the loaded scheduler
    is put back afterwards."""
    name, _, scheduler = variant.partition(":")
    pipe = pipes[name]
    loaded = pipe.scheduler
    if scheduler:
        pipe.scheduler = SCHEDULERS[scheduler](loaded.config)
    try:
        yield pipe, SIZES[name.partition("+")[0]]
    finally:
        pipe.scheduler = loaded


def reference(pipe: Any, side: int, case: Case) -> Reference:
    """The standard pipeline call for ``case`` alone (as the request-level runner calls it): its final latents
    (from the step-end callback) and its image."""
    final: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        final[:] = [tensors["latents"].clone()]
        return tensors

    kwargs: dict[str, Any] = {}
    if case.negative is not None:
        kwargs["negative_prompt"] = [case.negative]
    if case.rescale and "guidance_rescale" in inspect.signature(pipe.__call__).parameters:
        kwargs["guidance_rescale"] = case.rescale
    images = pipe(
        prompt=[case.prompt],
        generator=[torch.Generator().manual_seed(case.seed)],
        num_inference_steps=case.steps,
        guidance_scale=case.guidance,
        width=side,
        height=side,
        output_type="pil",
        callback_on_step_end=keep,
        **kwargs,
    ).images
    return Reference(final[0], np.asarray(images[0], dtype=np.int16))


def run(engine: StepEngine, joins: dict[int, list[Row]]) -> tuple[dict[str, Finished], dict[str, int]]:
    """Step ``engine`` until it is empty, joining ``joins[k]`` before step ``k``; each finished row and the number
    of steps the engine had taken when it finished."""
    finished: dict[str, Finished] = {}
    at: dict[str, int] = {}
    step = 0
    while len(engine) or any(k >= step for k in joins):
        engine.join(joins.get(step, []))
        for done in engine.step():
            finished[done.row.id] = done
            at[done.row.id] = step + 1
        step += 1
    return finished, at


def pixels(output: Any) -> np.ndarray:
    """An image's pixels, or a video's frames' stacked (``gpu_worker.runner.Video``), as int16."""
    frames = getattr(output, "frames", None)
    if frames is None:
        return np.asarray(output, dtype=np.int16)
    return np.stack([np.asarray(frame, dtype=np.int16) for frame in frames])


def assert_matches(engine: StepEngine, done: Finished, expected: Reference) -> None:
    """``done`` equals its solo pipeline call within the tolerances."""
    scale = float(expected.latents.abs().max())
    latent_error = float((done.latents - expected.latents).abs().max()) / scale
    assert latent_error <= LATENT_TOLERANCE, f"{done.row.id}: latents differ by {latent_error:.2e} (relative)"
    (output,) = engine.decode([done])
    pixel_error = int(np.abs(pixels(output) - expected.pixels).max())
    assert pixel_error <= PIXEL_TOLERANCE, f"{done.row.id}: pixels differ by {pixel_error}/255"


@contextmanager
def denoiser_calls(engine: StepEngine, before: Callable[[], None] | None = None) -> Iterator[list[int]]:
    """The batch size of every denoiser call while the block runs (``before`` runs at the start of each call)."""
    sizes: list[int] = []

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        sample = args[0] if args else kwargs["hidden_states"]  # the UNet's sample, the transformer's hidden states
        sizes.append(int(sample.shape[0]))
        if before is not None:
            before()

    handle = engine.adapter.denoiser.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield sizes
    finally:
        handle.remove()


def batch_size(cases: list[Case], steps_done: int) -> int:
    """The fused call's batch at a step: two halves per guided live row, one per unguided."""
    return sum(2 if case.guidance > 1 else 1 for case in cases if case.steps > steps_done)


# --- a row alone is the pipeline ---------------------------------------------------------------------------------

SOLO_VARIANTS = [
    *(f"stable-diffusion:{name}" for name in SCHEDULERS),
    "stable-diffusion-3",
    "stable-diffusion-3+t5",
]


@pytest.mark.parametrize("variant", SOLO_VARIANTS)
def test_a_row_alone_is_the_pipeline_call_bit_for_bit(pipes: dict[str, Any], variant: str) -> None:
    with setup(pipes, variant) as (pipe, side):
        for case in (GUIDED, UNGUIDED):
            engine = StepEngine(pipe, side, side)
            finished, at = run(engine, {0: [case.row("solo")]})
            expected = reference(pipe, side, case)
            done = finished["solo/0"]
            assert at["solo/0"] == case.steps
            assert torch.equal(done.latents, expected.latents), f"{variant}: {case} differs from the pipeline"
            (image,) = engine.decode([done])
            assert np.array_equal(np.asarray(image, dtype=np.int16), expected.pixels)


# --- running sets ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["stable-diffusion:ddim", "stable-diffusion:euler", "stable-diffusion-3"])
def test_rows_joining_at_later_steps_equal_their_solo_runs(pipes: dict[str, Any], variant: str) -> None:
    first = Case("a red fox", steps=6, guidance=5.0, seed=21, negative="blurry")
    second = Case("a blue whale", steps=4, guidance=3.0, seed=22)
    third = Case("a lighthouse at night", steps=3, guidance=1.0, seed=23)
    with setup(pipes, variant) as (pipe, side):
        engine = StepEngine(pipe, side, side)
        joins = {0: [first.row("a")], 2: [second.row("b")], 4: [third.row("c")]}
        finished, at = run(engine, joins)
        assert at == {"a/0": 6, "b/0": 2 + 4, "c/0": 4 + 3}
        for row_id, case in (("a/0", first), ("b/0", second), ("c/0", third)):
            assert_matches(engine, finished[row_id], reference(pipe, side, case))


@pytest.mark.parametrize(
    "variant",
    ["stable-diffusion:ddim", "stable-diffusion:euler-ancestral", "stable-diffusion:dpm", "stable-diffusion-3"],
)
def test_different_step_counts_and_guidance_scales_share_each_step(pipes: dict[str, Any], variant: str) -> None:
    with setup(pipes, variant) as (pipe, side):
        engine = StepEngine(pipe, side, side)
        engine.join([case.row(f"r{i}") for i, case in enumerate(MIXED)])
        finished: dict[str, Finished] = {}
        at: dict[str, int] = {}
        with denoiser_calls(engine) as sizes:
            step = 0
            while len(engine):
                step += 1
                for done in engine.step():
                    finished[done.row.id], at[done.row.id] = done, step
        assert sizes == [batch_size(MIXED, done) for done in range(step)], "one denoiser call per step, every row"
        assert at == {f"r{i}/0": case.steps for i, case in enumerate(MIXED)}
        images = engine.decode([finished[f"r{i}/0"] for i in range(len(MIXED))])  # one batched decode
        assert len({image.tobytes() for image in images}) == len(MIXED), "rows are not distinct"
        for i, case in enumerate(MIXED):
            assert_matches(engine, finished[f"r{i}/0"], reference(pipe, side, case))


def test_each_step_is_one_denoiser_call_over_the_live_rows(pipes: dict[str, Any]) -> None:
    with setup(pipes, "stable-diffusion") as (pipe, side):
        engine = StepEngine(pipe, side, side)
        engine.join([GUIDED.row("g"), UNGUIDED.row("u")])
        with denoiser_calls(engine) as sizes:
            engine.step()
            assert sizes == [2 + 1]  # the guided row's two halves, the unguided row's one
            engine.join([Case("a cat", steps=3, guidance=4.0, seed=5).row("late")])
            engine.step()
            assert sizes == [3, 3 + 2]
            assert [p.step for p in engine.progress()] == [2, 2, 1]
            finished = engine.step()  # the unguided row (3 steps) ends here
            assert [done.row.id for done in finished] == ["u/0"] and sizes == [3, 5, 5]
            finished = engine.step()  # the guided row (4 steps) and the late one (3) end together
            assert [done.row.id for done in finished] == ["g/0", "late/0"] and sizes == [3, 5, 5, 4]
            assert len(engine) == 0


@pytest.mark.parametrize("variant", ["stable-diffusion", "stable-diffusion-3"])
def test_an_aborted_row_leaves_at_the_next_step_and_its_peers_finish_unchanged(
    pipes: dict[str, Any], variant: str
) -> None:
    cases = {"a": MIXED[0], "b": MIXED[2], "c": MIXED[1]}
    with setup(pipes, variant) as (pipe, side):
        engine = StepEngine(pipe, side, side)
        engine.join([case.row(name) for name, case in cases.items()])
        finished: dict[str, Finished] = {}
        with denoiser_calls(engine) as sizes:
            for _ in range(2):
                engine.step()
            assert engine.abort("b/0") and not engine.abort("b/0")
            assert engine.live == ("a/0", "c/0")
            finished.update((done.row.id, done) for done in engine.step())
        assert sizes == [5, 5, 2 + 1], "the aborted row's halves must leave the next call"
        finished.update(run(engine, {})[0])
        assert sorted(finished) == ["a/0", "c/0"]
        for name in ("a", "c"):
            assert_matches(engine, finished[f"{name}/0"], reference(pipe, side, cases[name]))


def test_a_row_aborted_while_a_step_runs_is_not_returned(pipes: dict[str, Any]) -> None:
    with setup(pipes, "stable-diffusion") as (pipe, side):
        engine = StepEngine(pipe, side, side)
        short = Case("a tree", steps=2, guidance=3.0, seed=3)
        engine.join([short.row("x"), short.row("y")])
        engine.step()

        def abort_from_another_thread() -> None:
            aborter = threading.Thread(target=engine.abort, args=("y/0",))
            aborter.start()
            aborter.join(timeout=5)
            assert not aborter.is_alive(), "abort must not wait for the step"

        with denoiser_calls(engine, before=abort_from_another_thread):
            finished = engine.step()  # y's last step is computed, but y was aborted meanwhile
        assert [done.row.id for done in finished] == ["x/0"] and len(engine) == 0
        assert_matches(engine, finished[0], reference(pipe, side, short))


def test_a_failed_denoiser_call_leaves_every_row_as_it_was(pipes: dict[str, Any]) -> None:
    with setup(pipes, "stable-diffusion:euler") as (pipe, side):
        engine = StepEngine(pipe, side, side)
        engine.join([MIXED[0].row("a"), MIXED[2].row("b")])
        engine.step()

        def fail() -> None:
            raise RuntimeError("CUDA out of memory (simulated)")

        with denoiser_calls(engine, before=fail), pytest.raises(RuntimeError, match="out of memory"):
            engine.step()
        assert [p.step for p in engine.progress()] == [1, 1]
        with denoiser_calls(engine) as sizes:
            engine.step(only={"a/0"})  # e.g. halving the set after an out-of-memory step
        assert sizes == [2] and [p.step for p in engine.progress()] == [2, 1]
        finished, _ = run(engine, {})
        assert_matches(engine, finished["a/0"], reference(pipe, side, MIXED[0]))
        assert_matches(engine, finished["b/0"], reference(pipe, side, MIXED[2]))


# --- requests, keys, refusals -------------------------------------------------------------------------------------


def spec(**fields: Any) -> RequestSpec:
    base = {"id": "req", "model": "demo", "prompt": "a red fox", "seed": 7, "width": 32, "height": 32}
    base.update(num_inference_steps=3, guidance_scale=4.0, created_at=0.0)
    return RequestSpec(**{**base, **fields})


def test_a_request_is_n_rows_with_the_request_level_generators(pipes: dict[str, Any]) -> None:
    request = spec(n=2, negative_prompt="blurry")
    rows = rows_of(request)
    assert [row.id for row in rows] == ["req/0", "req/1"]
    expected_draws = [torch.randn(3, generator=g) for g in make_generators([request], "cpu")]
    assert all(torch.equal(torch.randn(3, generator=rows_of(request)[k].generator), expected_draws[k]) for k in (0, 1))
    with setup(pipes, "stable-diffusion") as (pipe, side):
        engine = StepEngine(pipe, side, side)
        engine.join(rows)
        engine.join([Case("a cat", steps=5, guidance=2.0, seed=1).row("other")])
        engine.step()
        assert engine.abort_request("other") == ["other/0"]
        finished, at = run(engine, {})
        assert at == {"req/0": 2, "req/1": 2}  # the rows of a request finish at the same step
        fused = pipe(  # the request-level runner's call for this request
            prompt=[request.prompt] * 2,
            negative_prompt=[request.negative_prompt] * 2,
            generator=make_generators([request], "cpu"),
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            width=side,
            height=side,
        ).images
        for k, image in enumerate(engine.decode([finished["req/0"], finished["req/1"]])):
            assert np.abs(np.asarray(image, dtype=np.int16) - np.asarray(fused[k], dtype=np.int16)).max() <= 1


def test_the_step_key_is_the_compat_key_less_the_per_row_fields() -> None:
    assert {f.name for f in fields(StepKey)} | PER_ROW == {f.name for f in fields(CompatKey)} | STEP_ONLY
    assert not {f.name for f in fields(StepKey)} & PER_ROW
    assert not {f.name for f in fields(CompatKey)} & STEP_ONLY
    base = spec()
    for per_row in (
        {"num_inference_steps": 9},
        {"guidance_scale": 1.0},
        {"guidance_rescale": 0.5},
        {"n": 3},
        {"negative_prompt": "x"},
        {"prompt": "a whale", "seed": 8},
        {"lora": LoraRef(name="style")},
    ):
        assert step_key(spec(**per_row)) == step_key(base), per_row
    for shared in ({"width": 64}, {"max_sequence_length": 64}):
        assert step_key(spec(**shared)) != step_key(base), shared


def test_what_the_engine_refuses(pipes: dict[str, Any]) -> None:
    pipe = pipes["stable-diffusion"]
    assert supports(pipe) and supports(pipes["stable-diffusion-3"])
    with pytest.raises(UnsupportedPipeline, match="step mode"):
        StepEngine(object(), 32, 32)
    assert not supports(object())
    with pytest.raises(ValueError, match="width"):
        StepEngine(pipe, 30, 32)
    with pytest.raises(ValueError, match="height"):
        StepEngine(pipes["stable-diffusion-3"], 16, 0)
    engine = StepEngine.for_key(pipe, step_key(spec()))
    with pytest.raises(ValueError, match="steps"):
        engine.join([Case("a", steps=0, guidance=2.0, seed=1).row("zero")])
    engine.join([GUIDED.row("one")])
    with pytest.raises(ValueError, match="already"):
        engine.join([UNGUIDED.row("two"), GUIDED.row("one")])
    assert engine.live == ("one/0",), "a refused join adds no row"


def test_the_announced_step_tasks_are_the_adapters(pipes: dict[str, Any]) -> None:
    """``ModelTraits.step_tasks`` says once what the adapter takes: SD's and SD3's rows carry every image task; no
    step mode, none. An engine for a key whose task the rows carry (None) refuses no task it takes (one it does
    not: ``test_step_engine_families.py::test_what_the_adapters_refuse``)."""
    image_tasks = (Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE, Task.INPAINT)
    assert step_tasks(pipes["stable-diffusion"]) == image_tasks
    assert step_tasks(pipes["stable-diffusion-3"]) == image_tasks
    assert step_tasks(object()) == ()
    key = step_key(spec(task=Task.IMAGE_TO_IMAGE, strength=0.5), image_tasks)
    assert key.task is None and key == step_key(spec(), image_tasks)
    StepEngine.for_key(pipes["stable-diffusion"], key)
    StepEngine.for_key(pipes["stable-diffusion-3"], step_key(spec(task=Task.INPAINT, strength=0.5), ()))


def test_the_bench_measures_fused_and_serial_steps(pipes: dict[str, Any]) -> None:
    (result,) = measure(pipes["stable-diffusion"], rows=[2], steps=2, side=32)
    assert result.rows == 2 and result.fused_s > 0 and result.serial_s > 0
