"""The physical limit: the pipeline alone, in this process, at batch sizes 1/2/4/8 (same model and settings)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from shared.contracts import RequestSpec
from shared.settings import Settings


def specs_for(batch: int, side: int = 64, steps: int = 4, guidance_scale: float = 5.0) -> list[RequestSpec]:
    return [
        RequestSpec(
            id=f"bench-{i}",
            model="demo",
            prompt=f"benchmark prompt {i}",
            seed=1000 + i,
            width=side,
            height=side,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            created_at=0.0,
        )
        for i in range(batch)
    ]


class PipelineBench:
    """The runner of the worker, loaded once in this process, timed at any batch size."""

    def __init__(self, settings: Settings) -> None:
        from gpu_worker.diffusers_runner import DiffusersRunner

        self.runner = DiffusersRunner(settings)
        self._warm: set[tuple[int, int]] = set()

    def images_per_s(self, batch: int, seconds: float = 5.0, side: int = 64) -> float:
        """Images/s of back-to-back fused calls of ``batch`` requests (after one warm-up call per shape)."""
        specs = specs_for(batch, side=side)
        if (batch, side) not in self._warm:
            self.runner.run(specs, lambda step, total: False)  # the first call of a shape is slow
            self._warm.add((batch, side))
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds or calls < 3:
            self.runner.run(specs, lambda step, total: False)
            calls += 1
        return calls * batch / (time.perf_counter() - started)


def measure_pipeline(
    settings: Settings, batch_sizes: Sequence[int] = (1, 2, 4, 8), seconds: float = 5.0, side: int = 64
) -> dict[str, Any]:
    """Images/s of the runner's fused call at each batch size."""
    bench = PipelineBench(settings)
    return {str(batch): {"images_per_s": bench.images_per_s(batch, seconds, side)} for batch in batch_sizes}
