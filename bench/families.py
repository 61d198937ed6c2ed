"""Every pipeline family's tiny demo pipeline through the real runner: fused == solo (max pixel difference) and the
speed of one fused call against the same requests run one by one. Prints the Markdown table of docs/models.md.

``python -m bench.families [--batch 4] [--steps 4] [--rounds 3]`` (CPU, ~1-2 minutes on 2 cores). The tiny models
are far too small for their batching gain to mean anything about a GPU: the figure shows the fused call works and
what it saves in per-call overhead, not a real model's speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from demo_models import DEMO_FAMILIES, DEMO_MODEL_NAME, ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.families import FAMILIES
from gpu_worker.runner import InputImages, Video
from shared.contracts import RequestSpec, Task
from shared.settings import Settings

PROMPTS = ("a red fox", "a blue whale in the sea", "a lighthouse at night", "a green forest", "a city", "a bird")


def family_runner(family: str, cache: Path) -> DiffusersRunner:
    """The real runner on ``family``'s demo pipeline (saved once in ``cache``, loaded back), on two torch threads."""
    ensure_demo_model(cache, family)
    return DiffusersRunner(Settings(model=None, demo_family=family, model_cache_dir=cache, torch_threads=2))


def family_specs(
    family: str, prompts: Sequence[str], *, side: int, steps: int, seed: int, negative: str, **extra: Any
) -> list[RequestSpec]:
    """A request of ``family``'s demo per prompt: ids ``{family}-{i}``, seeds from ``seed``, negative prompt
    ``negative`` (formatted with ``i``), ``side`` square (at least the family's size multiple), ``steps``, guidance
    4, true CFG 2 where the family has it (its negative prompts are used), a video's fewest frames at 8 fps;
    ``extra`` overrides."""
    traits = FAMILIES[family].traits
    if FAMILIES[family].loaded_task is None:  # an image-to-video model: every request brings its first frame
        extra = {"task": Task.IMAGE_TO_IMAGE, **extra}
    side = max(side, traits.size_multiple)
    fields: dict[str, Any] = {"width": side, "height": side, "num_inference_steps": steps, "guidance_scale": 4.0}
    if traits.true_cfg_scale:
        fields["true_cfg_scale"] = 2.0
    if traits.video:
        fields.update(num_frames=traits.frames_multiple + 1, fps=8)
    return [
        RequestSpec(
            id=f"{family}-{i}",
            model=DEMO_MODEL_NAME,
            prompt=prompt,
            negative_prompt=negative.format(i=i),
            seed=seed + i,
            created_at=0.0,
            **{**fields, **extra},
        )
        for i, prompt in enumerate(prompts)
    ]


def family_inputs(specs: Sequence[RequestSpec]) -> dict[str, InputImages] | None:
    """An input image per request of an image task (a smooth random picture of its size, distinct per request);
    None when the requests are text-to-image."""
    if not any(spec.task.needs_image for spec in specs):
        return None
    inputs: dict[str, InputImages] = {}
    for i, spec in enumerate(specs):
        small = np.random.default_rng(i).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((spec.width, spec.height), Image.Resampling.BILINEAR)
        inputs[spec.id] = InputImages(image)
    return inputs


def specs(family: str, batch: int, steps: int) -> list[RequestSpec]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    return family_specs(family, prompts, side=32, steps=steps, seed=10, negative="blurry")


def pixels(output: Any) -> np.ndarray:
    if isinstance(output, Video):
        return np.stack([np.asarray(frame.convert("RGB"), dtype=np.int16) for frame in output.frames])
    return np.asarray(output.convert("RGB"), dtype=np.int16)


def measure(family: str, cache: Path, batch: int, steps: int, rounds: int) -> dict[str, Any]:
    runner = family_runner(family, cache)
    batch_specs = specs(family, batch, steps)
    inputs = family_inputs(batch_specs)
    runner.run(batch_specs[:1], lambda step, total: False, inputs)  # warm-up
    fused_s, serial_s, difference = [], [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        fused = runner.run(batch_specs, lambda step, total: False, inputs)
        fused_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        solo = [runner.run([spec], lambda step, total: False, inputs)[0] for spec in batch_specs]
        serial_s.append(time.perf_counter() - started)
        for mine, alone in zip(fused, solo, strict=True):
            difference = max(difference, int(np.abs(pixels(mine[0]) - pixels(alone[0])).max()))
    return {
        "family": family,
        "pipeline": runner.pipeline_name,
        "side": batch_specs[0].width,
        "max_difference": difference,
        "fused_s": statistics.median(fused_s),
        "serial_s": statistics.median(serial_s),
    }


def table(rows: list[dict[str, Any]], batch: int, steps: int) -> str:
    lines = [
        f"| family | pipeline | size | max pixel difference fused vs solo (/255) | {batch} fused / {batch} serial (s) "
        "| speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        speedup = row["serial_s"] / row["fused_s"]
        lines.append(
            f"| `{row['family']}` | `{row['pipeline']}` | {row['side']} px, {steps} steps | {row['max_difference']} | "
            f"{row['fused_s']:.3f} / {row['serial_s']:.3f} | {speedup:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", default=",".join(DEMO_FAMILIES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusefleet-families-") as cache:
        rows = [measure(f, Path(cache), args.batch, args.steps, args.rounds) for f in args.families.split(",")]
    print(table(rows, args.batch, args.steps))


if __name__ == "__main__":
    main()
