"""One-command GPU run (``bench/gpu.sh`` or ``python -m bench gpu``): the pipeline alone and the fleet, on one host.

What it measures and what it found: docs/benchmarks.md, *One-command GPU run*. Contract: it downloads nothing (the
model is Stable Diffusion 1.5's architecture with seeded random weights, built and saved in fp16 under
``<cache>/sd15-arch-random-fp16`` once; ``--tiny``: the tiny demo model); the fleet's workers load it through the
real ``from_pretrained`` path, the pipeline alone through the worker's own runner; it stays within ``--budget-s``
(default 480 s): a timed point that would start past it is skipped and listed under ``skipped`` in the JSON (the
figures it feeds are then null); it writes ``bench-results/gpu.json`` and ``bench-results/gpu.md``. Without a CUDA
device, ``--device cuda`` (the default) exits 2 with a one-line message; ``--device cpu --tiny --size 64 --steps 2
--batches 1,2 --seqs 1,2`` runs the same thing on the CPU in well under a minute
(tests/integration/test_bench_gpu.py keeps that path working). ``compile_denoiser`` runs the pipeline alone and
the fleet with the exact accelerations' compiled denoiser (its buckets compiled at each worker's start, no batch
cap): P1/P2 with them. ``ensure_sd3_model`` builds the DiT of ``bench/gpu.sh accel`` (SD3 Medium's architecture).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, run_load
from bench.pipeline import specs_for
from bench.report import summarize, write_json
from bench.targets import FusefleetTarget

DEFAULT_BUDGET_S = 480.0
SD15_DIRNAME = "sd15-arch-random-fp16"
SD3_DIRNAME = "sd3-medium-arch-random-fp16"
_GIB = 1024**3
FLEET_START_ALLOWANCE_S = 30.0
"""What a fleet start (processes, the worker loading the model) is expected to take at most, for the budget."""
COMPILE_ALLOWANCE_S = 60.0
"""What a fleet start adds with a compiled denoiser (every bucket compiled at start, inductor's cache warm)."""


class NoCudaError(RuntimeError):
    """``--device cuda`` on a host where torch sees no CUDA device."""


@dataclass(frozen=True)
class GpuRunConfig:
    """Everything one run depends on (recorded in the JSON)."""

    device: str = "cuda"
    tiny: bool = False
    size: int = 512
    steps: int = 20
    guidance_scale: float = 7.5
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    seqs: tuple[int, ...] = (1, 4, 8)
    seconds: float = 4.0
    fleet_seconds: float = 8.0
    poisson_seconds: float = 15.0
    poisson_load: float = 0.8
    wait_ms: float = 20.0
    compile_denoiser: bool = False
    budget_s: float = DEFAULT_BUDGET_S
    torch_threads: int | None = None
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "fusefleet")
    out: Path = Path("bench-results/gpu.json")
    markdown: Path = Path("bench-results/gpu.md")
    log_dir: Path = Path("bench-results/logs/gpu")

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def dtype_name(self) -> str:
        return "float16" if self.cuda else "float32"

    @property
    def threads(self) -> int:
        return self.torch_threads if self.torch_threads is not None else (4 if self.cuda else 2)

    @property
    def pipeline_batches(self) -> list[int]:
        """The batch sizes the pipeline alone is measured at: ``batches`` plus every ``seqs`` (P1 needs them)."""
        return sorted(set(self.batches) | set(self.seqs))


@dataclass(frozen=True)
class SizedLoadSpec(LoadSpec):
    """A load whose every request asks for ``side`` x ``side`` px (``LoadSpec``'s workloads are 64/32 px)."""

    side: int = 512

    def params(self, index: int) -> dict[str, Any]:
        return {**super().params(index), "width": self.side, "height": self.side}


class Budget:
    """The run's deadline; timed points that would start past it are skipped and listed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.skipped: list[str] = []

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def left(self) -> float:
        return self.seconds - self.elapsed

    def allows(self, what: str, needs_s: float = 0.0) -> bool:
        if self.left > needs_s:
            return True
        self.skipped.append(f"{what} (at {self.elapsed:.0f} s of {self.seconds:.0f} s)")
        return False


# --- 1. the model ------------------------------------------------------------------------------------------------


def _sd_vae(latent_channels: int, sample_size: int, **config: Any) -> Any:
    """Stable Diffusion's VAE architecture (four blocks of 128-512 channels) with seeded random weights: SD 1.5's
    with 4 latent channels, SD3's with 16 (and its scaling, shift and no quant convs in ``config``)."""
    from diffusers import AutoencoderKL

    from demo_models.components import seeded

    return seeded(
        AutoencoderKL,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[128, 256, 512, 512],
        layers_per_block=2,
        latent_channels=latent_channels,
        norm_num_groups=32,
        act_fn="silu",
        sample_size=sample_size,
        **config,
    )


def _clip_text_config(hidden: int, layers: int, heads: int, act: str) -> Any:
    """A CLIP text encoder's config of this width and depth, with the ids of the tiny tokenizer (as SD 1.5's)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=49408,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=77,
        hidden_act=act,
        layer_norm_eps=1e-5,
        projection_dim=hidden,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )


def build_sd15_random_pipeline() -> Any:
    """A StableDiffusionPipeline with SD1.5's architecture and seeded random weights (fp32, on the CPU, not saved)."""
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    from demo_models.components import seeded
    from demo_models.stable_diffusion import sd_scheduler
    from demo_models.tokenizers import clip_tokenizer

    unet = seeded(  # runwayml/stable-diffusion-v1-5 unet/config.json
        UNet2DConditionModel,
        sample_size=64,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        cross_attention_dim=768,
        attention_head_dim=8,
        norm_num_groups=32,
        norm_eps=1e-5,
        act_fn="silu",
        center_input_sample=False,
        downsample_padding=1,
        flip_sin_to_cos=True,
        freq_shift=0,
        mid_block_scale_factor=1,
    )
    vae = _sd_vae(4, 512)  # SD's vae/config.json
    # openai/clip-vit-large-patch14's text config; ids of the tiny tokenizer
    text_encoder = seeded(CLIPTextModel, _clip_text_config(768, 12, 12, "quick_gelu"))
    return StableDiffusionPipeline(  # type: ignore[no-untyped-call]
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(77),
        unet=unet,
        scheduler=sd_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def ensure_sd15_model(cache_dir: Path) -> tuple[Path, bool]:
    """The folder of the fp16 SD1.5-architecture random pipeline under ``cache_dir``, built and saved there first
    when missing (``demo_models.catalog.save_once``). Returns (folder, whether it was built now)."""
    import torch

    from demo_models.catalog import save_once

    target = Path(cache_dir) / SD15_DIRNAME
    built = save_once(target, lambda: build_sd15_random_pipeline().to(torch.float16))
    gc.collect()
    return target, built


def build_sd3_random_pipeline(device: str = "cpu") -> Any:
    """A StableDiffusion3Pipeline with SD3 Medium's architecture (transformer 2.0 B parameters, CLIP-L and CLIP-G;
    without T5, as SD3 runs without it: zeros in its place) and seeded random weights, in fp32 on ``device`` (a
    GPU builds it in seconds), not saved."""
    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    from demo_models.components import flow_scheduler, seeded
    from demo_models.tokenizers import clip_tokenizer

    def clip(hidden: int, layers: int, heads: int, act: str) -> Any:
        return seeded(CLIPTextModelWithProjection, _clip_text_config(hidden, layers, heads, act))

    with torch.device(device):
        transformer = seeded(  # stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json
            SD3Transformer2DModel,
            sample_size=128,
            patch_size=2,
            in_channels=16,
            num_layers=24,
            attention_head_dim=64,
            num_attention_heads=24,
            joint_attention_dim=4096,
            caption_projection_dim=1536,
            pooled_projection_dim=2048,
            out_channels=16,
            pos_embed_max_size=192,
        )
        vae = _sd_vae(  # its vae/config.json: 16 latent channels, no quant convs
            16, 1024, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False
        )
        text_encoder = clip(768, 12, 12, "quick_gelu")  # CLIP ViT-L/14
        text_encoder_2 = clip(1280, 32, 20, "gelu")  # OpenCLIP ViT-bigG/14
    return StableDiffusion3Pipeline(  # type: ignore[no-untyped-call]
        transformer=transformer,
        scheduler=flow_scheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(77),
        text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tokenizer(77),
        text_encoder_3=None,
        tokenizer_3=None,
    )


def ensure_sd3_model(cache_dir: Path, device: str = "cpu") -> tuple[Path, bool]:
    """The folder of the fp16 SD3-Medium-architecture random pipeline under ``cache_dir`` (the DiT of
    ``bench/gpu.sh accel``), built on ``device`` and saved there first when missing. Returns (folder, whether it
    was built now)."""
    import torch

    from demo_models.catalog import save_once

    target = Path(cache_dir) / SD3_DIRNAME
    built = save_once(target, lambda: build_sd3_random_pipeline(device).to(torch.float16).to("cpu"))
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return target, built


def model_section(cfg: GpuRunConfig) -> dict[str, Any]:
    """Build (or find) the model; what it is, where it is, how long that took, its parameter counts."""
    from demo_models import DEFAULT_DEMO_FAMILY, demo_builder, demo_model_dir
    from demo_models.catalog import save_once

    started = time.perf_counter()
    if cfg.tiny:
        path = demo_model_dir(cfg.cache_dir)
        built = save_once(path, demo_builder(DEFAULT_DEMO_FAMILY))
    else:
        path, built = ensure_sd15_model(cfg.cache_dir)
    return {
        "kind": "tiny demo (stable-diffusion)" if cfg.tiny else "SD1.5 architecture, random weights, fp16",
        "path": str(path),
        "built_now": built,
        "build_s": time.perf_counter() - started,
        "bytes_on_disk": sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
    }


# --- 2. the pipeline alone ---------------------------------------------------------------------------------------


def _no_abort(step: int, total: int) -> bool:
    return False


def _compile_settings(cfg: GpuRunConfig) -> dict[str, Any]:
    """The settings of a compiled denoiser (``compile_denoiser``), for the pipeline alone and the fleet alike: its
    buckets up to the largest batch, inductor's cache in the model cache folder; none without it."""
    if not cfg.compile_denoiser:
        return {}
    return {
        "compile_denoiser": True,
        "max_num_seqs": max(cfg.pipeline_batches),
        "compile_cache_dir": cfg.cache_dir / "inductor",
    }


def measure_pipeline_alone(cfg: GpuRunConfig, model_dir: Path, budget: Budget) -> dict[str, Any]:
    """Images/s and peak accelerator memory of the worker's runner at each batch size, in this process."""
    import torch

    from gpu_worker.diffusers_runner import DiffusersRunner
    from shared.settings import Settings

    settings = Settings(
        model=str(model_dir),
        device=cfg.device,
        torch_dtype=cfg.dtype_name,
        torch_threads=cfg.threads,
        **_compile_settings(cfg),
    )
    started = time.perf_counter()
    runner = DiffusersRunner(settings)
    points: dict[str, Any] = {"load_s": time.perf_counter() - started, "batches": {}}
    try:
        for batch in cfg.pipeline_batches:
            if not budget.allows(f"pipeline alone, batch {batch}", needs_s=cfg.seconds):
                continue
            specs = specs_for(batch, side=cfg.size, steps=cfg.steps, guidance_scale=cfg.guidance_scale)
            if cfg.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            warm = time.perf_counter()
            runner.run(specs, _no_abort)  # the first call of a shape is slow
            warm_s = time.perf_counter() - warm
            calls, begun = 0, time.perf_counter()
            while calls < 2 or time.perf_counter() - begun < cfg.seconds:
                runner.run(specs, _no_abort)  # PIL output: the call ends when the GPU has finished
                calls += 1
            elapsed = time.perf_counter() - begun
            points["batches"][str(batch)] = {
                "images_per_s": calls * batch / elapsed,
                "seconds_per_call": elapsed / calls,
                "calls": calls,
                "warmup_s": warm_s,
                "peak_memory_bytes": torch.cuda.max_memory_allocated() if cfg.cuda else None,
            }
    finally:
        del runner
        gc.collect()
        if cfg.cuda:
            torch.cuda.empty_cache()  # the fleet's worker gets the accelerator to itself
    return points


# --- 3./4. the fleet -----------------------------------------------------------------------------------------------


def _load(base: str, spec: LoadSpec) -> dict[str, Any]:
    records = asyncio.run(run_load(FusefleetTarget(base), spec))
    return summarize(records)


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("requests", "succeeded", "failures", "first_errors", "duration_s", "images_per_s", "throughput_rps")
    return {
        **{k: summary[k] for k in keys},
        "latency_s": summary["latency_s"],
        "queue_wait_s": summary["queue_wait_s"],
        "mean_batch_size": summary["mean_batch_size"],
        "batch_size_histogram": summary["batch_size_histogram"],
    }


def fleet_env(cfg: GpuRunConfig, model_dir: Path) -> dict[str, str]:
    """The environment of the fleets' processes: the model, device and dtype; with ``compile_denoiser`` the
    compiled denoiser, inductor's cache shared with the pipeline alone, every bucket compiled at the worker's start
    (``batch_knee_warmup``) and no batch cap, so that a fleet's batches are max_num_seqs' size as the pipeline
    alone's are."""
    env = {"FUSEFLEET_MODEL": str(model_dir), "FUSEFLEET_DEVICE": cfg.device, "FUSEFLEET_TORCH_DTYPE": cfg.dtype_name}
    if cfg.compile_denoiser:
        env |= {
            "FUSEFLEET_COMPILE_DENOISER": "true",
            "FUSEFLEET_COMPILE_CACHE_DIR": str(cfg.cache_dir / "inductor"),
            "FUSEFLEET_BATCH_KNEE_WARMUP": f"{cfg.size}x{cfg.size}",
            "FUSEFLEET_BATCH_KNEE_CAP": "false",
        }
    return env


def measure_fleet(
    cfg: GpuRunConfig, model_dir: Path, pipe_rates: dict[int, float], budget: Budget
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Closed-loop saturating runs at each max_num_seqs; the Poisson run on the fleet of the largest one."""
    env = fleet_env(cfg, model_dir)
    start_allowance = FLEET_START_ALLOWANCE_S + (COMPILE_ALLOWANCE_S if cfg.compile_denoiser else 0.0)
    largest = max(cfg.seqs)
    fleet: dict[str, Any] = {}
    poisson: dict[str, Any] | None = None
    for seqs in sorted(cfg.seqs):
        rate = pipe_rates.get(seqs)
        if rate is None or not budget.allows(
            f"fleet, max_num_seqs {seqs}", needs_s=cfg.fleet_seconds + start_allowance
        ):
            if rate is None:
                budget.skipped.append(f"fleet, max_num_seqs {seqs} (no pipeline-alone figure at batch {seqs})")
            continue
        concurrency = 2 * seqs + 2  # a full batch waits while one runs
        count = seqs * max(3, math.ceil(rate * cfg.fleet_seconds / seqs))
        started = time.perf_counter()
        with bench_fleet(
            max_num_seqs=seqs,
            wait_ms=cfg.wait_ms if seqs > 1 else 0.0,
            torch_threads=cfg.threads,
            log_dir=cfg.log_dir / f"seqs-{seqs}",
            extra_env=env,
            ready_timeout_s=max(60.0, budget.left),
        ) as base:
            start_s = time.perf_counter() - started
            side = cfg.size
            common: dict[str, Any] = {"side": side, "steps": cfg.steps, "guidance_scale": cfg.guidance_scale}
            _load(base, SizedLoadSpec(pattern="closed", count=2 * seqs, concurrency=seqs, **common))  # warm-up
            closed = _load(base, SizedLoadSpec(pattern="closed", count=count, concurrency=concurrency, **common))
            fleet[str(seqs)] = {
                **_brief(closed),
                "concurrency": concurrency,
                "start_s": start_s,
                "pipeline_images_per_s": rate,
                "P1": closed["images_per_s"] / rate,
            }
            if seqs == largest and budget.allows("poisson run", needs_s=cfg.poisson_seconds):
                offered = cfg.poisson_load * rate
                spec = SizedLoadSpec(
                    pattern="poisson", rate=offered, count=max(3, round(offered * cfg.poisson_seconds)), **common
                )
                poisson = {
                    "max_num_seqs": seqs,
                    "offered_rps": offered,
                    "offered_fraction_of_pipeline": cfg.poisson_load,
                    **_brief(_load(base, spec)),
                }
    return fleet, poisson


# --- the run -------------------------------------------------------------------------------------------------------


def check_device(device: str) -> None:
    """NoCudaError (one line) when ``device`` is a CUDA device and torch sees none."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device or driver found"
        raise NoCudaError(
            f"no CUDA device: torch.cuda.is_available() is False ({why}, torch {torch.__version__}); "
            "run with --device cpu --tiny for a slow CPU run"
        )


def _environment(cfg: GpuRunConfig) -> dict[str, Any]:
    import diffusers
    import torch

    env: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cpu_count": os.cpu_count(),
        "device": cfg.device,
    }
    if cfg.cuda:
        props = torch.cuda.get_device_properties(torch.device(cfg.device))
        env |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    return env


def figures(cfg: GpuRunConfig, pipe: dict[str, Any], fleet: dict[str, Any]) -> dict[str, Any]:
    """P1 per max_num_seqs (and at the largest), P2 over the largest and smallest max_num_seqs."""
    low, high = min(cfg.seqs), max(cfg.seqs)
    p1 = {s: f["P1"] for s, f in fleet.items()}
    p2 = None
    have = all(str(s) in fleet and str(s) in pipe["batches"] for s in (low, high))
    if have and low != high:
        fleet_gain = fleet[str(high)]["images_per_s"] / fleet[str(low)]["images_per_s"]
        pipe_gain = pipe["batches"][str(high)]["images_per_s"] / pipe["batches"][str(low)]["images_per_s"]
        p2 = fleet_gain / pipe_gain
    return {"P1": p1.get(str(high)), "P1_by_max_num_seqs": p1, "P2": p2, "P2_over": [low, high]}


def run_gpu(cfg: GpuRunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole run; writes ``cfg.out`` (JSON) and ``cfg.markdown``; returns the results."""
    check_device(cfg.device)
    budget = Budget(cfg.budget_s)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "environment": _environment(cfg),
    }
    log(f"model: {'tiny demo' if cfg.tiny else 'SD1.5 architecture, random fp16 weights'} ...")
    results["model"] = model_section(cfg)
    model_dir = Path(results["model"]["path"])
    log(f"model at {model_dir} ({results['model']['build_s']:.1f} s); pipeline alone ...")
    results["pipeline"] = measure_pipeline_alone(cfg, model_dir, budget)
    rates = {int(b): p["images_per_s"] for b, p in results["pipeline"]["batches"].items()}
    log(f"pipeline alone: {', '.join(f'{b}: {r:.2f} img/s' for b, r in rates.items())}; fleet ...")
    results["fleet"], results["poisson"] = measure_fleet(cfg, model_dir, rates, budget)
    results["figures"] = figures(cfg, results["pipeline"], results["fleet"])
    results["skipped"] = budget.skipped
    results["elapsed_s"] = budget.elapsed
    results["within_budget"] = budget.elapsed <= cfg.budget_s and not budget.skipped
    write_json(cfg.out, results)
    cfg.markdown.parent.mkdir(parents=True, exist_ok=True)
    cfg.markdown.write_text(render_markdown(results))
    return results


# --- the report ----------------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / _GIB:.2f}"


def render_markdown(results: dict[str, Any]) -> str:
    cfg, env, model = results["config"], results["environment"], results["model"]
    pipe, fleet, poisson, figs = results["pipeline"], results["fleet"], results["poisson"], results["figures"]
    where = env.get("gpu") or f"CPU ({env['cpu_count']} cores)"
    lines = [
        f"# fusefleet GPU run, {results['started']}",
        "",
        f"{where}, torch {env['torch']}, diffusers {env['diffusers']}; model: {model['kind']}; "
        f"{cfg['size']}x{cfg['size']} px, {cfg['steps']} steps, CFG {cfg['guidance_scale']}, "
        f"{cfg['device']} {'fp16' if cfg['device'].startswith('cuda') else 'fp32'}"
        f"{', compiled denoiser' if cfg.get('compile_denoiser') else ''}; "
        f"{results['elapsed_s']:.0f} s of a {cfg['budget_s']:.0f} s budget.",
        "",
        "## The pipeline alone",
        "",
        "| batch | images/s | s per call | peak memory (GiB) |",
        "|---|---|---|---|",
    ]
    for batch, p in pipe["batches"].items():
        lines.append(
            f"| {batch} | {_num(p['images_per_s'])} | {_num(p['seconds_per_call'], 3)} | "
            f"{_gib(p['peak_memory_bytes'])} |"
        )
    lines += [
        "",
        "## The fleet (closed loop, one worker)",
        "",
        "| max_num_seqs | fleet images/s | pipeline alone images/s | P1 | mean batch | p50 (s) | p99 (s) | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seqs, f in fleet.items():
        lat = f["latency_s"]
        lines.append(
            f"| {seqs} | {_num(f['images_per_s'])} | {_num(f['pipeline_images_per_s'])} | {_num(f['P1'], 3)} | "
            f"{_num(f['mean_batch_size'])} | {_num(lat['p50'], 3)} | {_num(lat['p99'], 3)} | "
            f"{f['succeeded']}/{f['requests']} |"
        )
    low, high = figs["P2_over"]
    lines += [
        "",
        f"P1 (max_num_seqs {high}) = **{_num(figs['P1'], 3)}**; P2 = (fleet@{high} / fleet@{low}) / "
        f"(pipe@{high} / pipe@{low}) = **{_num(figs['P2'], 3)}**",
        "",
    ]
    lines += ["## Open loop (Poisson)", ""]
    if poisson is None:
        lines.append("not run (see skipped)")
    else:
        lat = poisson["latency_s"]
        lines += [
            "| max_num_seqs | offered req/s | throughput img/s | p50 (s) | p99 (s) | mean batch | ok |",
            "|---|---|---|---|---|---|---|",
            f"| {poisson['max_num_seqs']} | {_num(poisson['offered_rps'])} "
            f"({poisson['offered_fraction_of_pipeline']:.0%} of the pipeline alone) | {_num(poisson['images_per_s'])} "
            f"| {_num(lat['p50'], 3)} | {_num(lat['p99'], 3)} | {_num(poisson['mean_batch_size'])} | "
            f"{poisson['succeeded']}/{poisson['requests']} |",
        ]
    if results["skipped"]:
        lines += ["", "Skipped (time budget): " + "; ".join(results["skipped"])]
    return "\n".join(lines) + "\n"


def parse_sizes(value: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); ValueError unless positive integers."""
    sizes = tuple(int(part) for part in value.split(",") if part.strip())
    if not sizes or min(sizes) < 1:
        raise ValueError(f"expected positive integers separated by commas, got {value!r}")
    return sizes
