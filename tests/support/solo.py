"""What a request's image is when run alone in this process: the reference fused and step-mode results are compared
with (within 1/255)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from shared.contracts import LoraRef, RequestSpec
from shared.settings import Settings


def solo_runner_of(model_cache: Path, lora_dir: Path) -> DiffusersRunner:
    """The real runner on the tiny demo model, in this process."""
    return DiffusersRunner(Settings(model_cache_dir=model_cache, lora_dir=lora_dir))


def no_stop(step: int, total: int) -> bool:
    """A runner's step callback that never stops the run."""
    return False


def array_of(output: Any) -> np.ndarray:
    """An image as an int16 array; a video (``gpu_worker.runner.Video``) as its frames', stacked."""
    frames = getattr(output, "frames", None)
    if frames is None:
        return np.asarray(output, dtype=np.int16)
    return np.stack([np.asarray(frame, dtype=np.int16) for frame in frames])


def arrays_of(runner: DiffusersRunner, specs: Sequence[RequestSpec]) -> list[list[np.ndarray]]:
    """Each request's images (or videos) from one ``runner.run`` of ``specs``, as int16 arrays."""
    return [[array_of(output) for output in outputs] for outputs in runner.run(specs, no_stop)]


def solo_arrays(runner: DiffusersRunner, spec: RequestSpec) -> list[np.ndarray]:
    """The request's images run alone, as int16 arrays."""
    (images,) = arrays_of(runner, [spec])
    return images


def solo_image(runner: DiffusersRunner, state: dict[str, Any], lora: LoraRef | None = None) -> np.ndarray:
    params = state["params"]
    spec = RequestSpec(
        id="solo",
        model="demo",
        prompt=params["prompt"],
        negative_prompt=params.get("negative_prompt"),
        seed=state["seed"],
        width=params["width"],
        height=params["height"],
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        true_cfg_scale=params.get("true_cfg_scale"),
        num_frames=params.get("num_frames"),
        fps=params.get("fps"),
        n=1,
        lora=lora,
        created_at=0.0,
    )
    return solo_arrays(runner, spec)[0]


def png_array(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)
