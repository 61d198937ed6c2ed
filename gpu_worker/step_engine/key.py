"""The step key: requests with equal step keys may share one running set of the step engine.

It is the compatibility key (``shared.compat``) less what a row carries on its own (:data:`PER_ROW`): the number of
steps, the guidance scale and rescale (each row has its own scheduler and its own guidance), the output count (a
request is ``n`` rows) and whether a negative prompt is given (a row without one is guided by the empty prompt, as
the pipeline does). Prompt, negative-prompt text and seed were never in the key. What stays is what one fused
denoiser call cannot mix: size, frames, prompt sequence length (the text tokens the denoiser attends to), LoRA,
task and strength, and the model. The scheduler type is the loaded pipeline's, so one worker has one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from shared.compat import CompatKey, compat_key
from shared.contracts import RequestSpec, Task

PER_ROW: frozenset[str] = frozenset(
    {"num_inference_steps", "guidance_scale", "guidance_rescale", "n", "has_negative_prompt"}
)
"""The compatibility-key fields a row carries itself, so they do not split a running set."""


@dataclass(frozen=True, slots=True)
class StepKey:
    """Hashable step-mode bucket of a request: the :class:`CompatKey` fields not in :data:`PER_ROW`."""

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


def step_key(spec: RequestSpec) -> StepKey:
    """The step-mode bucket of ``spec``: its compatibility key without the per-row fields."""
    return from_compat(compat_key(spec))


def from_compat(key: CompatKey) -> StepKey:
    """``key`` less its :data:`PER_ROW` fields."""
    return StepKey(**{field.name: getattr(key, field.name) for field in fields(StepKey)})
