"""Runners for benchmarks, pluggable by import path like any runner (``FUSEFLEET_RUNNER``).

- ``NullRunner`` does no work: it measures the fleet's own overhead (API, Redis, scheduler, Celery).
- ``SimulatedGpuRunner`` sleeps for a cost model t(B) = a + b*B (``FUSEFLEET_SIM_BASE_MS``,
  ``FUSEFLEET_SIM_PER_IMAGE_MS``; with ``FUSEFLEET_SIM_REF_SIDE`` each image weighs its area) and returns
  placeholder images, so batching and scale-out behave as on a GPU (the time is spent off the CPU). The cost
  model, the sleeping and the images are ``bench.peers.simulated_gpu``'s, shared with the peer servers. Every
  figure it produces must be labelled *simulated*. With
  ``FUSEFLEET_SIM_TRACE=path`` (a benchmark's variable, not a setting) it appends one JSON line per forward
  (``start``, ``end``: wall-clock seconds; ``images``) to that file, for ``bench.gap``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from PIL import Image

from bench.peers.simulated_gpu import (
    REF_SIDE_ENV,
    TRACE_ENV,
    CostModel,
    placeholder_image,
    record_forward,
    sleep_forward,
)
from gpu_worker.runner import StepCallback
from shared.contracts import RequestSpec
from shared.settings import Settings


def placeholder_images(specs: Sequence[RequestSpec]) -> list[list[Image.Image]]:
    """One small grey image per requested output (``simulated_gpu.placeholder_image``)."""
    return [[placeholder_image(spec.width, spec.height)] * spec.n for spec in specs]


class NullRunner:
    """Returns placeholder images at once: the end-to-end cost of a request is fusefleet's alone."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        return placeholder_images(specs)


class SimulatedGpuRunner:
    """Sleeps a + b*B milliseconds per forward (B = output images, each weighted by its area when
    ``FUSEFLEET_SIM_REF_SIDE`` is set), reporting each step; no CPU work."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.cost = CostModel(settings.sim_base_ms, settings.sim_per_image_ms, int(os.environ.get(REF_SIDE_ENV) or 0))
        self.trace = os.environ.get(TRACE_ENV)

    def cost_s(self, images: int) -> float:
        """Seconds of a forward of ``images`` images of the reference size (``self.cost.forward_s`` weighs each
        image by its size)."""
        return self.cost.forward_s([(self.cost.ref_side, self.cost.ref_side)] * images)

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        started = time.time()
        images = sum(spec.n for spec in specs)
        seconds = self.cost.forward_s((spec.width, spec.height) for spec in specs for _ in range(spec.n))
        sleep_forward(seconds, specs[0].num_inference_steps, on_step)
        record_forward(self.trace, started, images)
        return placeholder_images(specs)
