"""Per-GPU speed side by side (``bench/gpu.sh accel`` or ``python -m bench accel``): the worker's own runner at
each batch size, once per variant, on the same device in one run.

Variants (``VARIANTS``): ``stock`` (diffusers as loaded: no prompt cache, no channels-last, eager), ``exact``
(the exact accelerations, ``gpu_worker.accelerations``: the prompt cache, channels-last on CUDA, the denoiser's
repeated blocks compiled with batch buckets; ``--no-compile`` leaves compilation out, for a CPU), and the
approximate ones over ``exact`` (``gpu_worker.approximations``): ``cached`` (``STEP_CACHE``: DeepCache every 3rd
step for a UNet, TaylorSeer every 3rd for a transformer that takes it) and ``approx`` (that step cache and
``QUANTIZATION``'s weights: fp8 matmuls on CUDA, int8 weights on a CPU). Each model's point says what was applied
(``applied``): a model that no step cache fits runs that variant without one; a variant this machine cannot run
(fp8 without torchao, ``pip install -e '.[quant]'``, or on a GPU older than compute capability 8.9) is skipped,
saying why.

``quantized`` is ``exact`` with those weights alone.

Models (``AccelConfig.models``): ``sd15`` (Stable Diffusion 1.5's architecture with random fp16 weights,
``bench.gpu``; ``--tiny``: the tiny demo) at ``--size`` (512), and ``dit`` at ``--dit-size`` (1024): ``--dit-model``
(a diffusers folder), else SD3 Medium's architecture with random fp16 weights built on the GPU and saved once
(``bench.gpu.ensure_sd3_model``); ``--tiny``: the tiny Stable Diffusion 3 demo.

Per point: images/s over at least two calls and ``--seconds`` (after one warm-up call that also compiles its
bucket), each variant's largest pixel deviation from ``stock`` on the same requests (/255), and its first request's
deviation from the same request run alone (its batch-1 point: fused vs solo, /255); per variant the
batch cap its times give (``gpu_worker.batch_knee.knee`` at the default margin, from seconds per call). A point
that would start past ``budget_s`` is skipped and listed under ``skipped``. Figures: ``P6_exact_speedup_sd15_b8``
and ``P6_exact_speedup_dit_b4`` (exact / stock images/s), ``P6_approx_speedup_sd15_b8`` (approx / stock, with
``P6_approx_deviation_sd15_b8``: its deviation /255); ``--docs`` merges the non-null ones into
docs/benchmarks.json, and only from a full-size CUDA run (a ``--tiny`` or CPU run is refused: its figures are no
GPU's). tests/integration/test_bench_accel.py runs the CPU tiny path.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import merge_figures, write_json

STEP_CACHE = "deepcache:3,taylorseer:3"
"""The approximate variants' step cache: the first that fits each model (``step_cache``)."""

QUANTIZATION = {True: "fp8", False: "int8_weight"}
"""The ``approx`` variant's weight quantization on CUDA (fp8 matmuls: a GPU of compute capability 8.9 or newer) and
elsewhere."""

VARIANTS: dict[str, dict[str, Any]] = {
    "stock": {"prompt_cache_entries": 0, "channels_last": False, "compile_denoiser": False},
    "exact": {"compile_denoiser": True},
    "cached": {"compile_denoiser": True, "step_cache": STEP_CACHE},
    "quantized": {"compile_denoiser": True, "weight_quantization": QUANTIZATION},
    "approx": {"compile_denoiser": True, "step_cache": STEP_CACHE, "weight_quantization": QUANTIZATION},
}
"""Each variant's settings over the run's own (the defaults are the exact accelerations' own choices); a dict value
is chosen by whether the run is on CUDA."""


@dataclass(frozen=True)
class AccelConfig:
    device: str = "cuda"
    tiny: bool = False
    size: int = 512
    dit_size: int = 1024
    dit_model: Path | None = None
    steps: int = 20
    batches: tuple[int, ...] = (1, 4, 8, 16)
    seconds: float = 4.0
    compile: bool = True
    models: tuple[str, ...] = ("sd15", "dit")
    variants: tuple[str, ...] = tuple(VARIANTS)
    budget_s: float = math.inf
    torch_threads: int | None = None
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "fusefleet")
    out: Path = Path("bench-results/accel.json")

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def __post_init__(self) -> None:
        unknown = sorted({*self.models} - {"sd15", "dit"}) + sorted({*self.variants} - {*VARIANTS})
        if unknown or "stock" not in self.variants:
            raise ValueError(f"models are sd15, dit; variants {', '.join(VARIANTS)}, stock among them: {unknown}")


def _models(cfg: AccelConfig) -> dict[str, tuple[dict[str, Any], int] | str]:
    """Each model's settings (``model``/``demo_family``) and side, or why it is skipped."""
    from bench.gpu import ensure_sd3_model, ensure_sd15_model

    def model(name: str) -> tuple[dict[str, Any], int]:
        if cfg.tiny:
            return {
                "model": None,
                "demo_family": {"sd15": "stable-diffusion", "dit": "stable-diffusion-3"}[name],
            }, cfg.size
        if name == "sd15":
            return {"model": str(ensure_sd15_model(cfg.cache_dir)[0])}, cfg.size
        dit = cfg.dit_model or ensure_sd3_model(cfg.cache_dir, cfg.device)[0]
        return {"model": str(dit)}, cfg.dit_size

    return {name: model(name) for name in cfg.models}


def _specs(family: str, batch: int, side: int, steps: int) -> list[Any]:
    from bench.families import family_specs

    prompts = [f"a benchmark prompt number {i}" for i in range(batch)]
    return family_specs(family, prompts, side=side, steps=steps, seed=1, negative="blurry")


def _measure(runner: Any, specs: list[Any], seconds: float, sync: Callable[[], None]) -> dict[str, Any]:
    warm = time.perf_counter()
    first = runner.run(specs, lambda step, total: False)
    warm_s = time.perf_counter() - warm
    calls, begun = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - begun < seconds:
        runner.run(specs, lambda step, total: False)
        calls += 1
    sync()
    elapsed = time.perf_counter() - begun
    return {
        "images_per_s": calls * len(specs) / elapsed,
        "seconds_per_call": elapsed / calls,
        "calls": calls,
        "warmup_s": warm_s,
        "first": np.asarray(first[0][0].convert("RGB"), dtype=np.int16),
    }


def run_accel(cfg: AccelConfig, docs_dir: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole run; writes ``cfg.out``; returns the results. RuntimeError (before anything runs) without the CUDA
    device ``cfg`` names, or when ``docs_dir`` is asked of a ``--tiny`` or CPU run."""
    import torch

    from bench.gpu import Budget
    from gpu_worker.batch_knee import knee
    from gpu_worker.diffusers_runner import DiffusersRunner
    from shared.settings import Settings

    if docs_dir is not None and (cfg.tiny or not cfg.cuda):
        raise RuntimeError("--docs records GPU figures: a --tiny or CPU run's are none (run it without --docs)")
    if cfg.cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: pass --device cpu (with --tiny --no-compile) to try it")
    budget = Budget(cfg.budget_s)
    margin = Settings().batch_knee_margin
    sync = torch.cuda.synchronize if cfg.cuda else (lambda: None)
    threads = cfg.torch_threads or (4 if cfg.cuda else 2)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "device_name": torch.cuda.get_device_name() if cfg.cuda else "cpu",
        "models": {},
    }

    def _variant(
        name: str, variant: str, settings: Settings, side: int, reference: dict[int, np.ndarray]
    ) -> dict[str, Any]:
        """One variant loaded and measured at every batch the budget allows; ``reference``: stock's first images."""
        started = time.perf_counter()
        runner = DiffusersRunner(settings)
        family = runner.family.name
        applied = runner.approximations.describe()
        exact = _exact(runner)
        loaded_s = time.perf_counter() - started
        log(f"{name} {variant}: {runner.pipeline_name} loaded in {loaded_s:.1f} s ({exact}; {applied})")
        by_batch: dict[str, Any] = {}
        firsts: dict[int, np.ndarray] = {}
        for batch in cfg.batches:
            if not budget.allows(f"{name} {variant} batch {batch}", needs_s=cfg.seconds):
                continue
            point = _measure(runner, _specs(family, batch, side, cfg.steps), cfg.seconds, sync)
            image = point.pop("first")
            if variant == "stock":
                reference[batch] = image
            point["deviation_255"] = int(np.abs(image - reference[batch]).max()) if batch in reference else None
            by_batch[str(batch)] = point
            firsts[batch] = image
            log(f"  batch {batch}: {point['images_per_s']:.3f} images/s, deviation {point['deviation_255']}")
        for size, point in by_batch.items():  # the first request is the same in every batch: fused vs solo
            point["solo_deviation_255"] = int(np.abs(firsts[int(size)] - firsts[1]).max()) if 1 in firsts else None
        cap = knee({int(b): p["seconds_per_call"] for b, p in by_batch.items()}, margin)
        by_batch = dict(sorted(by_batch.items(), key=lambda item: int(item[0])))  # measured in cfg's order
        return {"family": family, "side": side, "exact": exact, "applied": applied, "knee": cap, "batches": by_batch}

    for name, model in _models(cfg).items():
        if isinstance(model, str):
            results["models"][name] = {"skipped": model}
            log(f"{name}: skipped ({model})")
            continue
        chosen, side = model
        points: dict[str, dict[str, Any]] = {}
        reference: dict[int, np.ndarray] = {}
        for variant in cfg.variants:
            if not budget.allows(f"{name} {variant}", needs_s=cfg.seconds):
                continue
            overrides = {k: (v[cfg.cuda] if isinstance(v, dict) else v) for k, v in VARIANTS[variant].items()}
            overrides = {**overrides, "compile_denoiser": overrides.get("compile_denoiser", False) and cfg.compile}
            settings = Settings(
                **chosen,
                device=cfg.device,
                torch_dtype="float16" if cfg.cuda else "float32",
                torch_threads=threads,
                model_cache_dir=cfg.cache_dir,
                max_num_seqs=max(cfg.batches),
                **overrides,
            )
            try:
                points[variant] = _variant(name, variant, settings, side, reference)
            except Exception as exc:  # noqa: BLE001 - one variant that fails (fp8 without torchao or sm_89, a
                # compile error, out of memory) is reported and the run goes on; without stock nothing compares
                if variant == "stock":
                    raise
                points[variant] = {"skipped": f"{type(exc).__name__}: {exc}"}
                log(f"{name} {variant}: skipped ({type(exc).__name__}: {exc})")
            gc.collect()
            if cfg.cuda:
                torch.cuda.empty_cache()
        results["models"][name] = points
    results["figures"] = figures(results)
    results["skipped"] = budget.skipped
    results["elapsed_s"] = budget.elapsed
    write_json(cfg.out, results)
    if docs_dir is not None:
        merge_figures(docs_dir / "benchmarks.json", {k: v for k, v in results["figures"].items() if v is not None})
    return results


def _exact(runner: Any) -> str:
    """The exact accelerations ``runner`` runs with (``gpu_worker.accelerations``, the prompt cache)."""
    on = [f"compiled, buckets {list(runner.buckets)}"] if runner.buckets else ["eager"]
    if runner.settings.prompt_cache_entries:
        on.append("prompt cache")
    channels_last = runner.settings.channels_last
    if channels_last if channels_last is not None else runner.device.type == "cuda":
        on.append("channels-last")
    return ", ".join(on)


def _speedup(results: dict[str, Any], model: str, variant: str, batch: int) -> float | None:
    points = results["models"].get(model, {})
    try:
        fast = points[variant]["batches"][str(batch)]["images_per_s"]
        stock = points["stock"]["batches"][str(batch)]["images_per_s"]
    except KeyError:
        return None
    return float(fast / stock)


def _deviation(results: dict[str, Any], model: str, variant: str, batch: int) -> float | None:
    try:
        return float(results["models"][model][variant]["batches"][str(batch)]["deviation_255"])
    except (KeyError, TypeError):
        return None


def figures(results: dict[str, Any]) -> dict[str, float | None]:
    """The P6 figures (None where the point was not run)."""
    return {
        "P6_exact_speedup_sd15_b8": _speedup(results, "sd15", "exact", 8),
        "P6_exact_speedup_dit_b4": _speedup(results, "dit", "exact", 4),
        "P6_approx_speedup_sd15_b8": _speedup(results, "sd15", "approx", 8),
        "P6_approx_deviation_sd15_b8": _deviation(results, "sd15", "approx", 8),
    }


def markdown(results: dict[str, Any]) -> str:
    """Images/s by model, variant and batch, with the speed-up over stock and the deviation; the batch caps."""
    lines = [
        "| model | variant | applied | batch | images/s | x stock | deviation /255 | fused vs solo /255 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    caps = []
    for model, points in results["models"].items():
        if "skipped" in points:
            lines.append(f"| {model} | - | - | - | skipped: {points['skipped']} | | | |")
            continue
        for variant, run in points.items():
            if "skipped" in run:
                lines.append(f"| {model} | {variant} | - | - | skipped: {run['skipped']} | | | |")
                continue
            caps.append(f"{model} {variant}: {run.get('knee')}")
            for batch, point in run["batches"].items():
                gain = _speedup(results, model, variant, int(batch))
                where = f"{model} ({run['family']}, {run['side']} px)"
                lines.append(
                    f"| {where} | {variant} | {run.get('applied', '-')} | {batch} | "
                    f"{point['images_per_s']:.3f} | {'-' if gain is None else f'{gain:.2f}'} | "
                    f"{'-' if point['deviation_255'] is None else point['deviation_255']} | "
                    f"{'-' if point.get('solo_deviation_255') is None else point['solo_deviation_255']} |"
                )
    if caps:
        lines += ["", "Batch cap the knee gives (seconds per call by batch, default margin): " + "; ".join(caps)]
    if results.get("skipped"):
        lines += ["", "Skipped (time budget): " + "; ".join(results["skipped"])]
    return "\n".join(lines)
