"""The simulated GPU: the one cost model and the one output of every server in the GPU-shaped benchmark.

Contract: fusefleet's ``SimulatedGpuRunner`` and the peer servers import this one module (standard library and
Pillow only), so they all run the same forward: ``CostModel.forward_s`` / ``step_s`` say how long a call or a
step takes (``t = a + b * sum(w * h / ref_side**2)``, per step divided by ``ref_steps``), ``sleep_forward`` sleeps
it with the CPU free, ``placeholder_image`` is each output (encoded as PNG with ``compress_level=1`` by every
server), ``record_forward`` / ``record_step`` trace it. ``CostModel.env`` writes the ``FUSEFLEET_SIM_*`` variables
named below (no fleet setting) for every server; ``GPU_SHAPED`` is the fit of ``SD15_H200`` (the H200 run).
What each variable means and where a and b come from: docs/benchmarks.md#the-cost-model-and-where-a-and-b-come-from.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from PIL import Image

BASE_ENV = "FUSEFLEET_SIM_BASE_MS"
PER_IMAGE_ENV = "FUSEFLEET_SIM_PER_IMAGE_MS"
REF_SIDE_ENV = "FUSEFLEET_SIM_REF_SIDE"
REF_STEPS_ENV = "FUSEFLEET_SIM_REF_STEPS"
TRACE_ENV = "FUSEFLEET_SIM_TRACE"
REF_STEPS = 20
"""The step count of the measured curve (``SD15_H200``): the per-step cost divides a forward's cost by it when the
model has no ``ref_steps`` of its own."""
PLACEHOLDER_MAX_SIDE = 8
PLACEHOLDER_RGB = (128, 128, 128)

SD15_H200: dict[int, float] = {1: 0.653, 2: 0.736, 4: 1.012, 8: 1.230, 16: 2.235}
"""Batch size -> seconds per call: SD1.5 architecture, fp16, 512 px, 20 steps, CFG 7.5, one H200."""
SD_A100_DIFFUSERS_DOCS: dict[int, float] = {1: 1.98, 2: 2.38, 4: 3.89, 8: 7.04, 16: 13.55}
"""Batch size -> seconds per call: the published A100 curve of diffusers' "Accelerated PyTorch 2.0" benchmark
(huggingface/diffusers PR #2764, docs/source/en/optimization/torch2.0.mdx, the SDPA column); for comparison."""


@dataclass(frozen=True)
class CostModel:
    """t = a + b * (output images, each weighted by its area over ref_side**2): one fused forward (of ``ref_steps``
    denoising steps when set: then a forward of S steps costs t * S / ref_steps)."""

    base_ms: float
    per_image_ms: float
    ref_side: int = 0
    ref_steps: int = 0

    def units(self, width: int, height: int) -> float:
        """What one output image of ``width`` x ``height`` px costs, in images of ref_side x ref_side px."""
        return width * height / self.ref_side**2 if self.ref_side else 1.0

    def forward_s(self, sizes: Iterable[tuple[int, int]], steps: int | None = None) -> float:
        """Seconds of one fused forward whose output images have these (width, height), of ``steps`` denoising
        steps: scaled by steps / ref_steps when both are set, else the model's t whatever the steps."""
        seconds = (self.base_ms + self.per_image_ms * sum(self.units(w, h) for w, h in sizes)) / 1000.0
        return seconds * steps / self.ref_steps if steps is not None and self.ref_steps else seconds

    def step_s(self, sizes: Iterable[tuple[int, int]]) -> float:
        """Seconds of one denoising step of a running set whose rows (one per output image) have these (width,
        height): ``(a + b * rows) / ref_steps`` (``REF_STEPS`` when the model has none). An empty set costs 0."""
        units = [self.units(w, h) for w, h in sizes]
        if not units:
            return 0.0
        return (self.base_ms + self.per_image_ms * sum(units)) / 1000.0 / (self.ref_steps or REF_STEPS)

    def capacity(self, sides: Iterable[int], batch: int) -> float:
        """Images/s of the pipeline alone serving equal shares of square images of these sides, each in full
        batches of ``batch`` images of one size: the most any server can deliver for that mix."""
        sides = list(sides)
        return len(sides) * batch / sum(self.forward_s([(side, side)] * batch) for side in sides)

    def split_capacity(self, sides: Iterable[int], batch: int) -> float:
        """Images/s of a server whose every batch of ``batch`` interleaved requests holds equal shares of these
        sides and runs one call per side (batching whatever arrives, then splitting it by size), saturated."""
        sides = list(sides)
        share = batch / len(sides)
        units = sum(self.units(side, side) for side in sides)
        return batch / ((len(sides) * self.base_ms + self.per_image_ms * share * units) / 1000.0)

    def env(self) -> dict[str, str]:
        """The environment that configures this model in every server."""
        return {
            BASE_ENV: repr(self.base_ms),
            PER_IMAGE_ENV: repr(self.per_image_ms),
            REF_SIDE_ENV: str(self.ref_side),
            REF_STEPS_ENV: str(self.ref_steps),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CostModel:
        """The model the environment sets (a and b are required: no default is repeated here)."""
        missing = [name for name in (BASE_ENV, PER_IMAGE_ENV) if not environ.get(name, "").strip()]
        if missing:
            raise KeyError(f"the simulated GPU needs {' and '.join(missing)} in the environment")
        side, steps = (environ.get(name, "").strip() for name in (REF_SIDE_ENV, REF_STEPS_ENV))
        return cls(float(environ[BASE_ENV]), float(environ[PER_IMAGE_ENV]), int(side or 0), int(steps or 0))

    @classmethod
    def fit(cls, seconds_per_call: Mapping[int, float], ref_side: int = 0) -> CostModel:
        """Least-squares fit of ``t(B) = a + b * B`` to measured (batch size -> seconds per call) points."""
        points = sorted(seconds_per_call.items())
        if len({batch for batch, _ in points}) < 2:
            raise ValueError("a fit needs at least two batch sizes")
        mean_b = sum(batch for batch, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        slope = sum((batch - mean_b) * (t - mean_t) for batch, t in points) / sum(
            (batch - mean_b) ** 2 for batch, _ in points
        )
        return cls(round((mean_t - slope * mean_b) * 1000.0, 1), round(slope * 1000.0, 1), ref_side)


GPU_SHAPED = CostModel.fit(SD15_H200, ref_side=512)
"""a = 531.4 ms, b = 103.5 ms per 512 px image (the fit of SD15_H200)."""


def placeholder_image(width: int, height: int) -> Image.Image:
    """The image a simulated forward returns for one output: grey, the request's size capped at 8 x 8 px (tiny
    PNGs: what is measured is serving, not encoding)."""
    return Image.new("RGB", (min(PLACEHOLDER_MAX_SIDE, width), min(PLACEHOLDER_MAX_SIDE, height)), PLACEHOLDER_RGB)


def sleep_forward(seconds: float, steps: int = 1, on_step: Callable[[int, int], bool] | None = None) -> bool:
    """Spend ``seconds`` off the CPU in ``steps`` equal steps; ``on_step(step, steps)`` after each one may stop
    the forward early by returning True. Steps are timed from one start (deadlines), so slow callbacks do not add
    up. Returns whether the forward was stopped."""
    deadline = time.monotonic()
    for step in range(1, steps + 1):
        deadline += seconds / steps
        time.sleep(max(0.0, deadline - time.monotonic()))
        if on_step is not None and on_step(step, steps):
            return True
    return False


def record_forward(trace: str | None, started: float, images: int) -> None:
    """Append one forward to the trace file ``trace`` (nothing when None): ``start`` and ``end`` (wall-clock
    seconds, ``end`` = now) and ``images``. A benchmark's instrument, not a setting."""
    if trace:
        with open(trace, "a", encoding="utf-8") as out:
            out.write(json.dumps({"start": started, "end": time.time(), "images": images}) + "\n")


def record_step(trace: str | None, started: float, rows: int, finished: int) -> None:
    """Append one step of a running set to the trace file ``trace`` (nothing when None): ``start``, ``end`` (as
    ``record_forward``), ``rows`` stepped and ``finished`` (the output images that step completed). Forward and
    step lines share ``start`` and ``end``, so ``simcompare.forward_stats`` reads either."""
    if trace:
        with open(trace, "a", encoding="utf-8") as out:
            line = {"start": started, "end": time.time(), "rows": rows, "finished": finished}
            out.write(json.dumps(line) + "\n")
