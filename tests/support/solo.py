"""What a request's image is when run alone in this process: the reference fused and step-mode results are compared
with (within 1/255)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from shared.contracts import LoraRef, RequestSpec
from shared.settings import Settings


def solo_runner_of(model_cache: Path, lora_dir: Path) -> DiffusersRunner:
    """The real runner on the tiny demo model, in this process."""
    return DiffusersRunner(Settings(model_cache_dir=model_cache, lora_dir=lora_dir, torch_threads=2))


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
        n=1,
        lora=lora,
        created_at=0.0,
    )
    (images,) = runner.run([spec], lambda step, total: False)
    return np.asarray(images[0], dtype=np.int16)


def png_array(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


