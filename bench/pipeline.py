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


def measure_pipeline(
    settings: Settings, batch_sizes: Sequence[int] = (1, 2, 4, 8), seconds: float = 5.0, side: int = 64
) -> dict[str, Any]:
    """Images/s of the runner's fused call at each batch size, after a warm-up call per shape."""
    from gpu_worker.diffusers_runner import DiffusersRunner

    runner = DiffusersRunner(settings)
    results: dict[str, Any] = {}
    for batch in batch_sizes:
        specs = specs_for(batch, side=side)
        runner.run(specs, lambda step, total: False)  # warm-up: the first call of a shape is slow
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds or calls < 3:
            runner.run(specs, lambda step, total: False)
            calls += 1
        elapsed = time.perf_counter() - started
        results[str(batch)] = {"images_per_s": calls * batch / elapsed, "seconds_per_call": elapsed / calls}
    return results
