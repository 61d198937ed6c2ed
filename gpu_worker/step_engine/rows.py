"""What the step engine takes and gives back: a row (one output image of one request), its progress, and a
finished row's latents.

A row carries everything that may differ between the rows of one running set (prompt, negative prompt, steps,
guidance scale and rescale, true CFG scale, its own generator, its task with its strength, input image and mask, and
its LoRA adapter); what must be shared by the whole set (size, scheduler type, the model) is the step key's
(``shared.compat.StepKey``) and the engine's. Which tasks a family's rows may have, and whether their adapters
differ, is its adapter's (``FamilyAdapter.tasks``, ``FamilyAdapter.mixes_lora``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from PIL import Image

from gpu_worker.torch_env import make_generators
from shared.contracts import DEFAULT_STRENGTH, LoraRef, RequestSpec, Task


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
    true_cfg_scale: float | None = None
    """True classifier-free guidance (Flux, Qwen-Image): above 1, with a negative prompt, the row is guided by it;
    None: the pipeline's default (``FamilyAdapter.true_cfg``)."""
    output: int = 0
    """Which of its request's ``n`` outputs this row is (0-based)."""
    task: Task = Task.TEXT_TO_IMAGE
    strength: float | None = None
    """Image tasks: the part of its schedule the row denoises (it starts at step ``steps - int(steps x strength)``);
    None: ``DEFAULT_STRENGTH``."""
    image: Image.Image | None = None
    """Image tasks: the input image (RGB, of the set's size)."""
    mask: Image.Image | None = None
    """Inpainting: the mask (white = repaint, of the set's size)."""
    lora: LoraRef | None = None
    """The row's LoRA adapter (None: the base model)."""

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
        if self.true_cfg_scale is not None and not math.isfinite(self.true_cfg_scale):
            raise ValueError(f"row {self.id}: true_cfg_scale must be finite, got {self.true_cfg_scale}")
        if self.task.needs_image and self.image is None:
            raise ValueError(f"row {self.id}: image: {self.task} needs an input image")
        if self.task is Task.INPAINT and self.mask is None:
            raise ValueError(f"row {self.id}: mask: inpainting needs a mask")
        if self.task.needs_image and not 0.0 < self.denoising_strength <= 1.0:
            raise ValueError(f"row {self.id}: strength must be in (0, 1], got {self.strength}")

    @property
    def denoising_strength(self) -> float:
        """The row's strength (1.0 for text-to-image: its whole schedule)."""
        if not self.task.needs_image:
            return 1.0
        return DEFAULT_STRENGTH if self.strength is None else self.strength


def rows_of(
    spec: RequestSpec,
    device: torch.device | str = "cpu",
    image: Image.Image | None = None,
    mask: Image.Image | None = None,
) -> list[Row]:
    """The ``spec.n`` rows of a request, each with the generator the request-level runner gives that output
    (``make_generators``: output ``k`` seeded ``spec.seed + k``), its task, strength and LoRA, and (image tasks)
    the request's decoded input image and mask. They share their steps and strength, so they finish at the same
    step."""
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
            true_cfg_scale=spec.true_cfg_scale,
            generator=generator,
            task=spec.task,
            strength=spec.strength,
            image=image,
            mask=mask,
            lora=spec.lora,
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
