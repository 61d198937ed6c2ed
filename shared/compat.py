"""The compatibility key: requests with equal keys may share one fused pipeline forward.

The key holds every field that must be a scalar for the whole pipeline call (shape, frames and fps, steps, guidance
and true CFG, prompt sequence length, output count, LoRA identity, task and strength) and the presence of a
negative prompt. The task says whether the call is text-to-image, image-to-image or inpainting (a mask is present
exactly for inpainting). Prompt text, negative-prompt text, seed, the input image and mask themselves, and the
output encoding (format and quality, applied to each request's images after the forward) are per row and may
differ inside a batch (the api resizes every input image to the request's output size, so images of one batch
have one size).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

from shared.contracts import RequestSpec, Task


@dataclass(frozen=True, slots=True)
class CompatKey:
    """Hashable batching bucket of a request."""

    model: str
    width: int
    height: int
    num_frames: int | None
    num_inference_steps: int
    guidance_scale: float
    guidance_rescale: float
    true_cfg_scale: float | None
    max_sequence_length: int | None
    fps: int | None
    n: int
    lora_name: str | None
    lora_scale: float | None
    has_negative_prompt: bool
    task: Task
    strength: float | None


def compat_key(spec: RequestSpec) -> CompatKey:
    """The batching bucket of ``spec``; no LoRA is a bucket of its own."""
    return CompatKey(
        model=spec.model,
        width=spec.width,
        height=spec.height,
        num_frames=spec.num_frames,
        num_inference_steps=spec.num_inference_steps,
        guidance_scale=spec.guidance_scale,
        guidance_rescale=spec.guidance_rescale,
        true_cfg_scale=spec.true_cfg_scale,
        max_sequence_length=spec.max_sequence_length,
        fps=spec.fps,
        n=spec.n,
        lora_name=spec.lora.name if spec.lora else None,
        lora_scale=spec.lora.scale if spec.lora else None,
        has_negative_prompt=spec.negative_prompt is not None,
        task=spec.task,
        strength=spec.strength,
    )


def output_pixels(n: int, width: int, height: int, num_frames: int | None = None) -> int:
    """What a request adds to a fused forward's memory: output pixels, ``n x width x height (x frames)``.

    The per-batch budget ``max_batch_pixels`` is a bound on the sum of these (the scheduler closes a batch
    before it exceeds it; the api refuses a request that alone exceeds it).
    """
    return n * width * height * (num_frames or 1)


def pixel_cost(spec: RequestSpec) -> int:
    """``output_pixels`` of a stored request."""
    return output_pixels(spec.n, spec.width, spec.height, spec.num_frames)


# --- step mode -------------------------------------------------------------------------------------------------

PER_ROW: frozenset[str] = frozenset(
    {"num_inference_steps", "guidance_scale", "guidance_rescale", "n", "has_negative_prompt"}
)
"""The compatibility-key fields a row of the step engine carries itself (its own scheduler and step count, its own
guidance, a request is ``n`` rows, a guided row without a negative prompt is guided by the empty prompt), so they
do not split a running set."""


@dataclass(frozen=True, slots=True)
class StepKey:
    """Step-mode bucket of a request: the :class:`CompatKey` fields not in :data:`PER_ROW`, what one fused denoiser
    call cannot mix (size, frames, prompt sequence length, LoRA, task and strength, the model). Requests with equal
    step keys may share one running set (``docs/step_mode.md``)."""

    model: str
    width: int
    height: int
    num_frames: int | None
    true_cfg_scale: float | None
    max_sequence_length: int | None
    fps: int | None
    lora_name: str | None
    lora_scale: float | None
    task: Task
    strength: float | None

    @property
    def digest(self) -> str:
        """A short stable name of the key, the same in every process (how Redis names a running set's key)."""
        text = "|".join(f"{field.name}={getattr(self, field.name)!r}" for field in fields(self))
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


def step_key(spec: RequestSpec) -> StepKey:
    """The step-mode bucket of ``spec``: its compatibility key without the per-row fields."""
    return step_key_of(compat_key(spec))


def step_key_of(key: CompatKey) -> StepKey:
    """``key`` less its :data:`PER_ROW` fields."""
    return StepKey(**{field.name: getattr(key, field.name) for field in fields(StepKey)})
