"""Every family's tiny demo pipeline with each approximate acceleration (``gpu_worker.approximations``) against
its exact run through the real runner: the largest pixel deviation (/255) of two requests, and what was applied.
Prints the Markdown table of docs/models.md ("Approximate accelerations").

``python -m bench.approx_families [--steps 8] [--families flux,wan]`` (CPU, a few minutes on 2 cores). Tiny random
weights make the deviations a check that each setting is on and bounded, not a real model's figure
(``bench/gpu.sh accel`` measures SD 1.5's architecture on a GPU).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.families import family_inputs, family_specs, pixels
from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.families import FAMILIES
from shared.settings import Settings

SETTINGS = {
    "step cache": ("step_cache", "deepcache:3,taylorseer:3"),
    "first_block:0.9": ("step_cache", "first_block:0.9"),
    "int8_weight": ("weight_quantization", "int8_weight"),
    "fp8_weight": ("weight_quantization", "fp8_weight"),
}
"""Each column: the setting and its value (the step cache: the first that fits the family)."""


def measure(family: str, cache: Path, steps: int) -> dict[str, str]:
    """Each column's cell for ``family``: the deviation and what was applied, or why nothing was."""
    ensure_demo_model(cache, family)
    extra = {"max_sequence_length": 32} if FAMILIES[family].traits.max_sequence_length is not None else {}
    prompts = ["a red fox", "a blue whale"]
    specs = family_specs(family, prompts, side=32, steps=steps, seed=11, negative="blurry", **extra)

    def run(**settings: Any) -> tuple[DiffusersRunner, list[np.ndarray]]:
        runner = DiffusersRunner(
            Settings(model=None, demo_family=family, model_cache_dir=cache, torch_threads=2, **settings)
        )
        outputs = runner.run(specs, lambda step, total: False, family_inputs(specs))
        return runner, [pixels(request[0]).astype(np.int16) for request in outputs]

    _, exact = run()
    cells = {}
    for column, (name, value) in SETTINGS.items():
        runner, images = run(**{name: value})
        applied = runner.approximations
        if name == "step_cache" and applied.step_cache is None:
            cells[column] = "does not fit"
            continue
        deviation = max(int(np.abs(a - b).max()) for a, b in zip(exact, images, strict=True))
        cells[column] = f"{applied.step_cache}: {deviation}" if name == "step_cache" else str(deviation)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    print(f"| family | {' | '.join(SETTINGS)} |")
    print(f"|---|{'---|' * len(SETTINGS)}")
    with tempfile.TemporaryDirectory() as cache:
        for family in args.families.split(","):
            cells = measure(family, Path(cache), args.steps)
            print(f"| `{family}` | {' | '.join(cells[column] for column in SETTINGS)} |", flush=True)


if __name__ == "__main__":
    main()
