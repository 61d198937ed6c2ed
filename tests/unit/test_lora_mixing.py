"""Requests with different LoRA adapters or scales share one fused forward (``gpu_worker.lora``,
``LoraActivator.mixed``) on the tiny Stable Diffusion 1.x demo pipeline (float32, CPU): each row equals its solo run
within 1/255, in one pipeline call whose denoiser sees every row."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("peft")

from demo_models import ensure_demo_model  # noqa: E402
from gpu_worker.diffusers_runner import DiffusersRunner  # noqa: E402
from gpu_worker.lora import BASE_ADAPTER, LoraMixingError, lora_layers, rows_for_batch  # noqa: E402
from shared.compat import compat_key  # noqa: E402
from shared.contracts import LoraRef, RequestSpec  # noqa: E402
from shared.settings import Settings  # noqa: E402
from tests.support.lora import make_test_lora  # noqa: E402
from tests.support.solo import arrays_of, no_stop  # noqa: E402
from tests.support.specs import demo_spec  # noqa: E402

SIZE, STEPS, GUIDANCE = 32, 3, 5.0
STYLE, OTHER = "style", "other.v2"  # a dot in the name: peft refuses such adapter names, the activator renames
ROWS: list[LoraRef | None] = [
    None,
    LoraRef(name=STYLE, scale=1.0),
    LoraRef(name=STYLE, scale=0.5),
    LoraRef(name=OTHER, scale=1.0),
]


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> DiffusersRunner:
    cache = tmp_path_factory.mktemp("model-cache")
    loras = tmp_path_factory.mktemp("loras")
    model = ensure_demo_model(cache)
    make_test_lora(model, loras, STYLE, seed=1)
    make_test_lora(model, loras, OTHER, seed=2)
    return DiffusersRunner(Settings(model_cache_dir=cache, lora_dir=loras))


def spec(i: int, lora: LoraRef | None, n: int = 1) -> RequestSpec:
    prompt = ["a castle", "a bridge", "a castle", "a red fox"][i % 4]
    return demo_spec(f"r{i}", STEPS, GUIDANCE, side=SIZE, n=n, seed=10 + i, prompt=prompt, lora=lora)


@contextmanager
def denoiser_batches(runner: DiffusersRunner) -> Iterator[list[int]]:
    """The batch size of every UNet call made inside the block."""
    seen: list[int] = []
    handle = runner.pipe.unet.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    try:
        yield seen
    finally:
        handle.remove()


def test_the_compat_key_leaves_the_lora_out() -> None:
    assert len({compat_key(spec(0, lora)) for lora in ROWS}) == 1


def test_one_fused_call_of_mixed_adapters_and_scales_equals_each_solo_run(runner: DiffusersRunner) -> None:
    specs = [spec(i, lora) for i, lora in enumerate(ROWS)]
    solo = [arrays_of(runner, [one])[0][0] for one in specs]
    with denoiser_batches(runner) as batches:
        fused = [images[0] for images in arrays_of(runner, specs)]
    assert batches == [2 * len(specs)] * STEPS, "one fused forward: every UNet call holds every row, guided"
    for i, (mine, alone) in enumerate(zip(fused, solo, strict=True)):
        assert np.abs(mine - alone).max() <= 1, f"row {i} ({ROWS[i]}) differs from its solo run"
    for i in range(1, len(solo)):  # the adapters, and the scales, really differ
        assert np.abs(solo[i] - solo[0]).max() > 1, ROWS[i]
    assert np.abs(solo[1] - solo[2]).max() > 1 and np.abs(solo[1] - solo[3]).max() > 1
    assert runner.loras.loaded == {STYLE, OTHER} and runner.loras.copies == 3
    # after a mixed call, a plain batch is the base model again and a single-adapter batch is that adapter
    assert np.abs(arrays_of(runner, [specs[0]])[0][0] - solo[0]).max() == 0
    assert np.abs(arrays_of(runner, [specs[2]])[0][0] - solo[2]).max() == 0


def test_n_outputs_per_request_keep_their_adapter(runner: DiffusersRunner) -> None:
    specs = [spec(0, ROWS[1], n=2), spec(1, None, n=2), spec(2, ROWS[3], n=2)]
    fused = arrays_of(runner, specs)
    for one, images in zip(specs, fused, strict=True):
        alone = arrays_of(runner, [one])[0]
        assert [np.abs(a - b).max() for a, b in zip(images, alone, strict=True)] <= [1] * one.n, one.id


def test_without_mixing_a_batch_runs_one_call_per_adapter_in_request_order(runner: DiffusersRunner) -> None:
    specs = [spec(i, lora) for i, lora in enumerate([ROWS[1], None, ROWS[1], ROWS[3]])]
    mixed = arrays_of(runner, specs)
    runner.lora_mixing = False
    try:
        with denoiser_batches(runner) as batches:
            grouped = arrays_of(runner, specs)
    finally:
        runner.lora_mixing = True
    assert sorted(batches) == sorted([4] * STEPS + [2] * STEPS * 2), "calls of 2 rows (style) and 1 and 1, guided"
    for a, b in zip(mixed, grouped, strict=True):
        assert np.abs(a[0] - b[0]).max() <= 1


def test_copies_beyond_the_bound_are_deleted_least_recently_used_first(runner: DiffusersRunner) -> None:
    loras = runner.loras
    before = loras.max_loaded
    loras.max_loaded = 2
    try:
        reference = arrays_of(runner, [spec(3, ROWS[3])])[0][0]
        arrays_of(runner, [spec(1, ROWS[1]), spec(2, ROWS[2])])  # both styles needed: kept, the other deleted
        assert loras.copies == 2 and loras.loaded == {STYLE}
        again = arrays_of(runner, [spec(3, ROWS[3])])[0][0]  # loaded again (a style copy goes)
        assert loras.copies == 2 and loras.loaded == {STYLE, OTHER}
        assert np.abs(again - reference).max() == 0
    finally:
        loras.max_loaded = before


def test_rows_are_mapped_onto_a_batch_of_the_rows_or_twice_them() -> None:
    names = ["a", BASE_ADAPTER, "b"]
    assert rows_for_batch(names, 3) == names
    assert rows_for_batch(names, 6) == [*names, *names]  # classifier-free guidance: uncond rows, cond rows
    assert rows_for_batch(["a", "a"], 7) == ["a"] * 7  # one adapter fits any batch
    with pytest.raises(LoraMixingError, match="batch of 4"):
        rows_for_batch(names, 4)


def test_a_missing_adapter_fails_the_mixed_batch_naming_it_and_leaves_no_hook(runner: DiffusersRunner) -> None:
    base = arrays_of(runner, [spec(0, None)])[0][0]
    with pytest.raises(FileNotFoundError, match="nope"):
        runner.run([spec(0, None), spec(1, LoraRef(name="nope"))], no_stop)
    assert not any(layer._forward_pre_hooks for layer in lora_layers(runner.pipe))
    assert np.abs(arrays_of(runner, [spec(0, None)])[0][0] - base).max() == 0
