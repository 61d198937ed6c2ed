"""The compatibility key: requests with equal keys may share one fused pipeline forward.

The key holds every field that must be a scalar for the whole pipeline call (shape, frames and fps, steps, guidance
and true CFG, prompt sequence length, output count, task and strength) and the presence of a negative prompt. The
task says whether the call is text-to-image, image-to-image or inpainting (a mask is present exactly for
inpainting). Prompt text, negative-prompt text, seed, the input image and mask themselves, the LoRA adapter and its
scale, and the output encoding (format and quality, applied to each request's images after the forward) are per row
and may differ inside a batch (the api resizes every input image to the request's output size, so images of one
batch have one size). The worker applies each row's own adapter in the one fused forward (``gpu_worker.lora``:
peft's per-row ``adapter_names``); a pipeline that cannot mix adapters runs the batch's rows grouped by adapter
inside the worker. The step key keeps the adapter (the step engine runs one adapter per running set).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

from shared.contracts import LoraRef, RequestSpec, Task


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
    has_negative_prompt: bool
    task: Task
    strength: float | None


def compat_key(spec: RequestSpec) -> CompatKey:
    """The batching bucket of ``spec`` (its LoRA adapter is per row: not in the key)."""
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

STEP_ONLY: frozenset[str] = frozenset({"lora_name", "lora_scale"})
"""The step-key fields that are not compatibility-key fields: the LoRA adapter and scale, per row in a request-level
forward but one per running set (the step engine's denoiser and prompt-encoder calls run the adapter active on the
pipeline). :class:`StepKey`'s fields are exactly the :class:`CompatKey` fields less :data:`PER_ROW`, plus these."""


@dataclass(frozen=True, slots=True)
class StepKey:
    """Step-mode bucket of a request: the :class:`CompatKey` fields not in :data:`PER_ROW`, plus the LoRA adapter
    and scale (:data:`STEP_ONLY`): what one running set's fused denoiser calls cannot mix (size, frames, prompt
    sequence length, LoRA, task and strength, the model). Requests with equal step keys may share one running set
    (``docs/step_mode.md``). The digest of a key is unchanged by the LoRA's move out of the compatibility key."""

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
    """The step-mode bucket of ``spec``: its compatibility key without the per-row fields, with its LoRA."""
    return step_key_of(compat_key(spec), spec.lora)


def step_key_of(key: CompatKey, lora: LoraRef | None = None) -> StepKey:
    """``key`` less its :data:`PER_ROW` fields, with the adapter ``lora`` (None: the base model)."""
    shared = {name: getattr(key, name) for name in (field.name for field in fields(StepKey)) if name not in STEP_ONLY}
    return StepKey(**shared, lora_name=lora.name if lora else None, lora_scale=lora.scale if lora else None)
