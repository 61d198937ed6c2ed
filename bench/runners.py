"""Runners for benchmarks, pluggable by import path like any runner (``FUSEFLEET_RUNNER``).

- ``NullRunner`` does no work: it measures the fleet's own overhead (API, Redis, scheduler, Celery).
- ``SimulatedGpuRunner`` sleeps for a cost model t(B) = a + b*B (``FUSEFLEET_SIM_BASE_MS``,
  ``FUSEFLEET_SIM_PER_IMAGE_MS``) and returns placeholder images, so batching and scale-out behave as on a GPU
  (the time is spent off the CPU). Every figure it produces must be labelled *simulated*. With
  ``FUSEFLEET_SIM_TRACE=path`` (a benchmark's variable, not a setting) it appends one JSON line per forward
  (``start``, ``end``: wall-clock seconds; ``images``) to that file, for ``bench.gap``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from PIL import Image

from gpu_worker.runner import StepCallback
from shared.contracts import RequestSpec
from shared.settings import Settings


def placeholder_images(specs: Sequence[RequestSpec]) -> list[list[Image.Image]]:
    """One small grey image per requested output (the size of the request, at most 8x8 to keep PNGs tiny)."""
    return [[Image.new("RGB", (min(8, spec.width), min(8, spec.height)), (128, 128, 128))] * spec.n for spec in specs]


class NullRunner:
    """Returns placeholder images at once: the end-to-end cost of a request is fusefleet's alone."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        return placeholder_images(specs)


class SimulatedGpuRunner:
    """Sleeps a + b*B milliseconds per forward (B = output images), reporting each step; no CPU work."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.base_s = settings.sim_base_ms / 1000.0
        self.per_image_s = settings.sim_per_image_ms / 1000.0
        self.trace = os.environ.get("FUSEFLEET_SIM_TRACE")

    def cost_s(self, images: int) -> float:
        return self.base_s + self.per_image_s * images

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        started = time.time()
        steps = specs[0].num_inference_steps
        images = sum(spec.n for spec in specs)
        step_s = self.cost_s(images) / steps
        deadline = time.monotonic()
        for step in range(1, steps + 1):
            deadline += step_s
            time.sleep(max(0.0, deadline - time.monotonic()))
            if on_step(step, steps):
                break
        if self.trace:
            with open(self.trace, "a", encoding="utf-8") as trace:
                trace.write(json.dumps({"start": started, "end": time.time(), "images": images}) + "\n")
        return placeholder_images(specs)
