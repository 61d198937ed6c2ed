"""What the step engine takes and gives back: a row (one output image of one request), its progress, and a
finished row's latents.

A row carries everything that may differ between the rows of one running set (prompt, negative prompt, steps,
guidance scale and rescale, and its own generator); what must be shared by the whole set (size, LoRA, scheduler
type, task) is the step key's (``shared.compat.StepKey``) and the engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpu_worker.torch_env import make_generators
from shared.contracts import RequestSpec


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    """One output image of one request, as the engine denoises it.

    ``generator`` is the row's own: it draws the row's initial latents and any noise its scheduler adds at a step,
    and nothing else, so a row's draws never depend on which rows share its steps.
    """

    request_id: str
    prompt: str
    steps: int
    guidance_scale: float
    generator: torch.Generator
    negative_prompt: str | None = None
    guidance_rescale: float = 0.0
    output: int = 0
    """Which of its request's ``n`` outputs this row is (0-based)."""

    @property
    def id(self) -> str:
        """``request_id/output``: unique among the rows of a running set."""
        return f"{self.request_id}/{self.output}"

    def check(self) -> None:
        """ValueError naming the field when the row cannot be denoised."""
        if self.steps < 1:
            raise ValueError(f"row {self.id}: steps must be >= 1, got {self.steps}")
        if not math.isfinite(self.guidance_scale):
            raise ValueError(f"row {self.id}: guidance_scale must be finite, got {self.guidance_scale}")
        if not 0.0 <= self.guidance_rescale <= 1.0:
            raise ValueError(f"row {self.id}: guidance_rescale must be in [0, 1], got {self.guidance_rescale}")


def rows_of(spec: RequestSpec, device: torch.device | str = "cpu") -> list[Row]:
    """The ``spec.n`` rows of a request, each with the generator the request-level runner gives that output
    (``make_generators``: output ``k`` seeded ``spec.seed + k``). They share their steps, so they finish at the
    same step."""
    generators = make_generators([spec], device)
    return [
        Row(
            request_id=spec.id,
            output=k,
            prompt=spec.prompt,
            negative_prompt=spec.negative_prompt,
            steps=spec.num_inference_steps,
            guidance_scale=spec.guidance_scale,
            guidance_rescale=spec.guidance_rescale,
            generator=generator,
        )
        for k, generator in enumerate(generators)
    ]


@dataclass(frozen=True, slots=True)
class RowProgress:
    """Where a live row stands: ``step`` denoiser calls done of its ``total``."""

    row_id: str
    request_id: str
    step: int
    total: int


@dataclass(frozen=True, slots=True, eq=False)
class Finished:
    """A row whose last step is done: its final latents (batch of one), ready to decode."""

    row: Row
    latents: torch.Tensor
