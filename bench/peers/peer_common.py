"""Pipeline work shared by the peer servers (runs inside a peer venv, never in the project venv).

Both peers import this module so that they do exactly fusefleet's per-batch work: the same saved pipeline,
the same ``torch.set_num_threads``, one fused pipeline call per (width, height, steps, guidance) group with
a prompt list and one seeded CPU generator per image, and PNG encoding with ``compress_level=1``. With
``BENCH_RUNNER=simulated`` each group's call is instead the simulated GPU of ``simulated_gpu.py`` (the cost model
and placeholder images fusefleet's ``SimulatedGpuRunner`` uses; no torch, no model).

Environment:
    BENCH_RUNNER          ``diffusers`` (default) or ``simulated`` (then FUSEFLEET_SIM_*: see simulated_gpu.py)
    BENCH_MODEL_DIR       the saved pipeline directory (``ensure_demo_model(...)``'s return value); required
                          by the diffusers runner
    BENCH_TORCH_THREADS   ``torch.set_num_threads`` value (default 2)
    BENCH_MAX_BATCH_SIZE  the peer's max batch size (default 4)
"""

from __future__ import annotations

import io
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

GROUP_FIELDS = ("width", "height", "num_inference_steps", "guidance_scale")
REQUEST_DEFAULTS: dict[str, Any] = {
    "width": 64,
    "height": 64,
    "num_inference_steps": 4,
    "guidance_scale": 7.5,
    "seed": 0,
}
Forward = Callable[[Sequence[Mapping[str, Any]]], list[Any]]
"""One pipeline call for requests sharing GROUP_FIELDS: PIL images in request order."""


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def log(message: str) -> None:
    """One line on stderr (the launcher sends it to the peer's log file)."""
    print(f"[peer {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def normalize_request(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The request fields with their types, defaults filled in (``prompt`` is required)."""
    req = {**REQUEST_DEFAULTS, **raw}
    return {
        "prompt": str(req["prompt"]),
        "width": int(req["width"]),
        "height": int(req["height"]),
        "num_inference_steps": int(req["num_inference_steps"]),
        "guidance_scale": float(req["guidance_scale"]),
        "seed": int(req["seed"]),
    }


def load_pipeline(model_dir: str | None = None) -> Any:
    """The saved StableDiffusionPipeline on CPU, float32, progress bar off, no safety checker."""
    import torch
    from diffusers import StableDiffusionPipeline

    torch.set_num_threads(env_int("BENCH_TORCH_THREADS", 2))
    path = model_dir or os.environ["BENCH_MODEL_DIR"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
        pipe: Any = StableDiffusionPipeline.from_pretrained(path, torch_dtype=torch.float32)
    if getattr(pipe, "safety_checker", None) is not None:
        pipe.safety_checker = None
    pipe.set_progress_bar_config(disable=True)
    log(f"loaded {path} (torch threads={torch.get_num_threads()}, torch {torch.__version__})")
    return pipe.to("cpu")


def load_forward() -> Forward:
    """This peer's pipeline call, by ``BENCH_RUNNER``: the saved diffusers pipeline, or the simulated GPU."""
    runner = os.environ.get("BENCH_RUNNER", "diffusers")
    if runner == "simulated":
        from simulated_gpu import TRACE_ENV, CostModel, placeholder_image, record_forward, sleep_forward

        cost, trace = CostModel.from_env(), os.environ.get(TRACE_ENV)
        log(f"simulated GPU: {cost}")

        def simulated(reqs: Sequence[Mapping[str, Any]]) -> list[Any]:
            started = time.time()
            sleep_forward(cost.forward_s((r["width"], r["height"]) for r in reqs))
            record_forward(trace, started, len(reqs))
            return [placeholder_image(r["width"], r["height"]) for r in reqs]

        return simulated
    if runner != "diffusers":
        raise ValueError(f"BENCH_RUNNER={runner!r}: expected diffusers or simulated")
    pipe = load_pipeline()
    return lambda reqs: run_group(pipe, reqs)


def to_png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def run_group(pipe: Any, reqs: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One fused pipeline call for requests sharing GROUP_FIELDS; PIL images in request order."""
    import torch

    head = reqs[0]
    images = pipe(
        prompt=[r["prompt"] for r in reqs],
        generator=[torch.Generator("cpu").manual_seed(r["seed"]) for r in reqs],
        num_images_per_prompt=1,
        width=head["width"],
        height=head["height"],
        num_inference_steps=head["num_inference_steps"],
        guidance_scale=head["guidance_scale"],
        output_type="pil",
    ).images
    if len(images) != len(reqs):
        raise RuntimeError(f"pipeline returned {len(images)} images for {len(reqs)} prompts")
    return list(images)


def run_batch(forward: Forward, reqs: Sequence[Mapping[str, Any]], peer: str) -> list[bytes]:
    """PNG bytes per request, in order: requests are grouped by GROUP_FIELDS, one ``forward`` call per group.

    The peers batch whatever arrives together, whatever its size; fusefleet batches by key upstream, so here
    each mixed batch is split into same-key sub-batches run one after the other.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, req in enumerate(reqs):
        groups.setdefault(tuple(req[f] for f in GROUP_FIELDS), []).append(i)
    started = time.perf_counter()
    out: list[bytes | None] = [None] * len(reqs)
    for indices in groups.values():
        images = forward([reqs[i] for i in indices])
        for i, image in zip(indices, images, strict=True):
            out[i] = to_png(image)
    sizes = [len(v) for v in groups.values()]
    log(f"{peer} batch size={len(reqs)} groups={sizes} took={time.perf_counter() - started:.3f}s")
    return [png for png in out if png is not None]
