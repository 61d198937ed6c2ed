"""DiffusersRunner on the real tiny demo pipeline (CPU, no Redis): fusion, seeds, n, LoRA, steps, speed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.lora import LoraActivator
from gpu_worker.torch_env import make_generators
from shared.contracts import LoraRef, RequestSpec
from shared.settings import Settings
from tests.support.lora import make_test_lora
from tests.support.specs import demo_spec

SIZE, STEPS, GUIDANCE = 64, 4, 5.0
PROMPTS = ["a photo of a cat", "a red house in the forest", "portrait painting", "blue sea at night"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def model_dir(cache_dir: Path) -> Path:
    return ensure_demo_model(cache_dir)


@pytest.fixture(scope="session")
def lora_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loras")
    make_test_lora(model_dir, root, "style-a", seed=1)
    return root


@pytest.fixture(scope="session")
def runner(cache_dir: Path, model_dir: Path, lora_dir: Path) -> DiffusersRunner:
    return DiffusersRunner(Settings(model_cache_dir=cache_dir, lora_dir=lora_dir))


def spec(
    prompt: str, seed: int, *, n: int = 1, lora: LoraRef | None = None, negative: str | None = None
) -> RequestSpec:
    rid = f"{prompt}-{seed}"
    return demo_spec(rid, STEPS, GUIDANCE, side=SIZE, n=n, seed=seed, negative=negative, prompt=prompt, lora=lora)


def no_stop(step: int, total: int) -> bool:
    return False


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def max_diff(a: Image.Image, b: Image.Image) -> int:
    return int(np.abs(pixels(a) - pixels(b)).max())


def solo(runner: DiffusersRunner, s: RequestSpec) -> list[Image.Image]:
    [images] = runner.run([s], no_stop)
    return images


def assert_same(a: Sequence[Image.Image], b: Sequence[Image.Image]) -> int:
    assert len(a) == len(b)
    worst = max(max_diff(x, y) for x, y in zip(a, b, strict=True))
    assert worst <= 1, f"max pixel diff {worst} > 1/255"
    return worst


def test_fused_property(runner: DiffusersRunner) -> None:
    assert type(runner.pipe).__name__ == "StableDiffusionPipeline"
    assert runner.fused is True


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_fused_batch_matches_solo_runs(runner: DiffusersRunner, negative: str | None) -> None:
    specs = [spec(p, seed=10 + i, negative=negative and f"{negative} {i}") for i, p in enumerate(PROMPTS)]
    fused = runner.run(specs, no_stop)
    assert [len(images) for images in fused] == [1] * len(specs)
    assert all(img.size == (SIZE, SIZE) for images in fused for img in images)
    worst = max(assert_same(images, solo(runner, s)) for images, s in zip(fused, specs, strict=True))
    print(f"fused B=4 vs solo: max pixel diff {worst}/255")


def test_n_images_per_request_in_order(runner: DiffusersRunner) -> None:
    specs = [spec("a photo of a cat", seed=3, n=2), spec("a green tree", seed=7, n=2)]
    fused = runner.run(specs, no_stop)
    assert [len(images) for images in fused] == [2, 2]
    for images, s in zip(fused, specs, strict=True):
        assert_same(images, solo(runner, s))
        assert max_diff(images[0], images[1]) > 1  # seed + 0 and seed + 1
    # image k of a request is seeded seed + k: the second image of seed 3 is the first of seed 4.
    assert_same([fused[0][1]], solo(runner, spec("a photo of a cat", seed=4)))


def test_seeds(runner: DiffusersRunner) -> None:
    a, b, a_again = (solo(runner, spec("a photo of a dog", seed=s))[0] for s in (1, 2, 1))
    assert max_diff(a, b) > 10
    assert max_diff(a, a_again) == 0


def test_make_generators_seed_per_image() -> None:
    gens = make_generators([spec("x", seed=5, n=2), spec("y", seed=9, n=1)], "cpu")
    assert [g.initial_seed() for g in gens] == [5, 6, 9]


def test_lora_changes_output_and_base_is_restored(runner: DiffusersRunner) -> None:
    base = solo(runner, spec("a photo of a cat", seed=42))[0]
    with_lora = solo(runner, spec("a photo of a cat", seed=42, lora=LoraRef(name="style-a", scale=1.0)))[0]
    half = solo(runner, spec("a photo of a cat", seed=42, lora=LoraRef(name="style-a", scale=0.5)))[0]
    assert max_diff(base, with_lora) > 10
    assert max_diff(half, with_lora) > 1
    assert max_diff(half, base) > 1
    after = solo(runner, spec("a photo of a cat", seed=42))[0]
    assert max_diff(after, base) == 0
    again = solo(runner, spec("a photo of a cat", seed=42, lora=LoraRef(name="style-a", scale=1.0)))[0]
    assert max_diff(again, with_lora) == 0
    assert runner.loras.loaded == {"style-a"}


def test_lora_errors(runner: DiffusersRunner) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        runner.loras.activate(LoraRef(name="nope"))
    with pytest.raises(ValueError, match="style-a"):
        LoraActivator(runner.pipe, None).activate(LoraRef(name="style-a"))


def test_on_step_progress_and_stop(runner: DiffusersRunner) -> None:
    calls: list[tuple[int, int]] = []

    def record(step: int, total: int) -> bool:
        calls.append((step, total))
        return False

    runner.run([spec("a cat", seed=1)], record)
    assert calls == [(i, STEPS) for i in range(1, STEPS + 1)]

    stopped: list[tuple[int, int]] = []

    def stop_at_two(step: int, total: int) -> bool:
        stopped.append((step, total))
        return step >= 2

    runner.run([spec("a cat", seed=1), spec("a dog", seed=2)], stop_at_two)
    assert stopped == [(1, STEPS), (2, STEPS)]
    assert len(stopped) < STEPS


def test_image_time(runner: DiffusersRunner) -> None:
    s = spec("a photo of a cat", seed=0)
    solo(runner, s)  # warm-up of this shape
    start = time.perf_counter()
    solo(runner, s)
    elapsed = time.perf_counter() - start
    print(f"64x64, {STEPS} steps, CFG: {elapsed * 1000:.0f} ms per image")
    assert elapsed < 5.0


def test_ensure_demo_model_idempotent(model_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    start = time.perf_counter()
    assert ensure_demo_model(cache_dir) == model_dir
    assert time.perf_counter() - start < 0.5
    # no temp dirs left behind (beside the runners' own state there: their batch-knee tables and compile cache)
    assert not [p for p in cache_dir.iterdir() if p.name not in {model_dir.name, "batch-knees", "inductor"}]

    one, two = ensure_demo_model(tmp_path / "one"), ensure_demo_model(tmp_path / "two")
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert Path("unet/diffusion_pytorch_model.safetensors") in files
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for rel in files:
        assert (one / rel).read_bytes() == (two / rel).read_bytes(), rel
