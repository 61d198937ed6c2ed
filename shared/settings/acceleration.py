"""Per-GPU speed: what keeps outputs exact (the prompt-embedding cache, ``gpu_worker.prompt_cache``; batches capped
where batching stops paying, ``gpu_worker.batch_knee``; channels-last, the attention backend, a compiled denoiser,
``gpu_worker.accelerations``) and the approximate accelerations, opt-in (step caching and weight quantization,
``gpu_worker.approximations``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from shared.settings.concern import JsonObjectFromEnv, OptionalUserPath, SettingsConcern

STEP_CACHES = ("deepcache", "taylorseer", "first_block")
"""The step caches ``step_cache`` names: DeepCache (UNets), TaylorSeer and first-block cache (transformers)."""

QUANTIZATIONS = ("off", "int8_weight", "fp8_weight", "fp8")
"""The ``weight_quantization`` values."""

WeightQuantization = Literal["off", "int8_weight", "fp8_weight", "fp8"]

_CHOICE = re.compile(r"([a-z_]+):([0-9]*\.?[0-9]+)")


@dataclass(frozen=True)
class StepCacheChoice:
    """One step cache of ``step_cache``: its method and its parameter (an interval in steps, or a threshold)."""

    method: str
    value: float

    def __str__(self) -> str:
        return f"{self.method}:{self.value:g}"


def parse_step_cache(value: str) -> tuple[StepCacheChoice, ...]:
    """``step_cache``'s choices in order (empty: ``off``); ValueError naming the setting for a bad one."""
    text = value.strip()
    if text in ("", "off"):
        return ()
    choices = []
    for part in (p.strip() for p in text.split(",")):
        match = _CHOICE.fullmatch(part)
        if match is None or match.group(1) not in STEP_CACHES:
            raise ValueError(
                f"step_cache: {part!r} is not one of off, deepcache:<interval>, taylorseer:<interval>, "
                "first_block:<threshold> (comma-separated for several)"
            )
        method, number = match.group(1), float(match.group(2))
        if method in ("deepcache", "taylorseer") and (number != int(number) or number < 2):
            raise ValueError(f"step_cache: {part!r}: the interval of {method} is a whole number of steps, at least 2")
        if method == "first_block" and not 0 < number < 1:
            raise ValueError(f"step_cache: {part!r}: the threshold of first_block is between 0 and 1 (e.g. 0.05)")
        choices.append(StepCacheChoice(method, number))
    return tuple(choices)


def _valid_step_cache(value: str) -> str:
    parse_step_cache(value)
    return value


StepCache = Annotated[str, AfterValidator(_valid_step_cache)]
"""A ``step_cache`` value, checked (``parse_step_cache``)."""

MODEL_APPROXIMATIONS = ("step_cache", "weight_quantization")
"""The approximate accelerations a model of the fleet may set for itself (``model_approximations``;
``[models.<name>]`` of the fleet config file)."""


class ModelApproximations(BaseModel):
    """One model's own approximate accelerations (``MODEL_APPROXIMATIONS``); unset ones are the fleet-wide ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_cache: StepCache | None = None
    weight_quantization: WeightQuantization | None = None

    def given(self) -> dict[str, object]:
        """The settings this model sets, by name."""
        return {name: value for name in MODEL_APPROXIMATIONS if (value := getattr(self, name)) is not None}


class AccelerationSettings(SettingsConcern):
    """How a worker saves work inside its pipeline without changing a request's output."""

    section = "Acceleration"

    prompt_cache_entries: int = Field(1024, ge=0)
    """Encoded prompts (each with its negative prompt) a worker keeps per model, least recently used dropped first,
    so a repeated prompt and a shared negative prompt are encoded once; 0 = no prompt cache."""

    prompt_cache_mb: float = Field(256.0, ge=0)
    """Bound on the memory (on the model's device) the prompt cache of one model holds, in MiB; an encoded prompt
    larger than this is not kept."""

    batch_knee_cap: bool | None = None
    """Whether a worker announces its batch knees, so the scheduler caps batches there; unset = on for a CUDA
    device (a CPU's forward times are too noisy to cap on, and a capped fleet would batch by timing in tests).
    The knees are measured either way."""

    batch_knee_margin: float = Field(0.1, ge=0)
    """Batch only where it pays: a worker announces, per model and request pixel cost, the largest batch up to which
    each doubling gains at least this much throughput (0.1: ten percent) by its measured forward times, and the
    scheduler caps batches there (never above max_num_seqs; gpu_worker/batch_knee.py)."""

    batch_knee_warmup: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Request sizes (WIDTHxHEIGHT, comma-separated, e.g. 512x512,1024x1024) a worker times at start, batches of
    1, 2, 4, ... up to max_num_seqs at 2 steps each, for the sizes not in its knee table on disk yet; empty (the
    default, cheap on a CPU): only live forwards measure."""

    channels_last: bool | None = None
    """Channels-last memory format for the UNet and VAE (exact: the same arithmetic in the layout convolution kernels
    prefer); unset = on for a CUDA device, off elsewhere."""

    sdpa_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = "auto"
    """The scaled-dot-product-attention backend of every forward: auto = torch's choice per call, or one pinned."""

    compile_denoiser: bool = False
    """torch.compile the denoiser's repeated blocks (regional compilation), each batch padded up to its bucket (1, 2,
    4, ... max_num_seqs; padding rows dropped, never in a result) so each bucket compiles once; compiled rows equal
    their solo runs within 1/255. Off by default: it pays on a GPU, after a compile of seconds to minutes per bucket
    (batch_knee_warmup compiles the buckets at start)."""

    compile_cache_dir: OptionalUserPath = None
    """Where torch's inductor keeps compiled artifacts across restarts; unset = <model_cache_dir>/inductor."""

    step_cache: StepCache = "off"
    """APPROXIMATE, opt-in: denoising steps that reuse an earlier step's work (gpu_worker/approximations.py). off;
    deepcache:<N> (UNet families, SD 1.x/2.x and SDXL: every N-th step in full, the others recompute only the
    outermost blocks; rows stay independent of their peers); taylorseer:<N> (transformer families: every N-th step in
    full, the others predicted; rows independent); first_block:<T> (transformer families: a step skips all blocks
    but the first when its residual changed by less than T; decided over the whole batch, so a row's output may
    depend on its peers). Comma-separated for several: each model takes the first that fits it, none = exact. A model
    with a step cache runs request-level, not step mode. Measured deviations: docs/models.md, Accelerations."""

    weight_quantization: WeightQuantization = "off"
    """APPROXIMATE, opt-in: the denoiser's linear weights quantized through torchao (installed with the worker
    extra). off; int8_weight (int8 weights); fp8_weight (fp8 weights computed in the pipeline's dtype: memory, not
    speed); fp8 (fp8 weights and activations, fp8 matmuls: a CUDA GPU of compute capability 8.9 or newer only, an
    error elsewhere). Measured deviations: docs/models.md, Accelerations."""

    model_approximations: Annotated[dict[str, ModelApproximations], NoDecode, JsonObjectFromEnv] = Field(
        default_factory=dict
    )
    """Per-model step_cache and weight_quantization where a model differs from the fleet-wide ones: a JSON object,
    model name -> {step_cache, weight_quantization} (e.g. '{"sd": {"step_cache": "deepcache:3"}}'); the fleet config
    file sets them under [models.<name>]. A model not named takes the fleet-wide settings."""

    @field_validator("batch_knee_warmup", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            for size in value:
                if not isinstance(size, str) or not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", size):
                    raise ValueError(f"batch_knee_warmup: {size!r} is not WIDTHxHEIGHT (e.g. 512x512)")
        return value

    @property
    def knee_warmup_sizes(self) -> list[tuple[int, int]]:
        """``batch_knee_warmup`` as (width, height) pairs."""
        return [(int(w), int(h)) for w, h in (size.split("x") for size in self.batch_knee_warmup)]
