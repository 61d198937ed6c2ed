"""Batching: how waiting requests are fused into one forward, and in which order they are served."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import NoDecode

from shared.contracts import PRIORITY_MAX, PRIORITY_MIN
from shared.settings.concern import JsonObjectFromEnv, SettingsConcern, field_adapter

SchedulingPolicy = Literal["priority", "fcfs", "fair"]
"""The queue orders (``scheduling_policy``); ``scheduler.queue.QUEUES`` holds the queue of each."""
BatchOrder = Literal["strict", "grouped"]
"""How a batch is formed behind its head (``batch_order``, ``scheduler.policy``)."""
MODEL_ENGINE_ARGS = ("max_num_seqs", "request_batch_max_wait_ms", "max_batch_pixels")
"""The batching settings a model of the fleet may set for itself (``model_batching``; ``[models.<name>]`` of the
fleet config file): each bounded as the fleet-wide setting of that name."""


class ModelBatching(BaseModel):
    """One model's own engine args (``MODEL_ENGINE_ARGS``); unset ones are the fleet-wide settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_seqs: int | None = None
    request_batch_max_wait_ms: float | None = None
    max_batch_pixels: int | None = None
    share: float = Field(1.0, gt=0, le=1_000_000)
    """Its weight in the fair order (``scheduling_policy = "fair"``): times the API key's, its flows' weight."""

    @model_validator(mode="after")
    def _within_fleet_bounds(self) -> ModelBatching:
        for name, value in self.given().items():
            try:
                BatchingSettings.validate_engine_arg(name, value)
            except ValidationError as exc:
                raise ValueError(f"{name}: {exc.errors()[0]['msg']}") from None
        return self

    def given(self) -> dict[str, object]:
        """The engine args this model sets, by name."""
        return {name: value for name in MODEL_ENGINE_ARGS if (value := getattr(self, name)) is not None}


class BatchingSettings(SettingsConcern):
    """The batching policy of the scheduler (``scheduler.policy``) and its queue order (``scheduler.queue``)."""

    section = "Batching and queue order"

    max_num_seqs: int = Field(1, ge=1, le=256)
    """Most requests fused into one pipeline forward (1 = no batching)."""

    request_batch_max_wait_ms: float = Field(0.0, ge=0.0, le=60_000.0)
    """Upper bound on the admission wait of a new wave: trades first-request latency for fuller batches. 0 dispatches at
    once."""

    batch_order: BatchOrder = "strict"
    """'strict': a batch is the oldest request plus the FOLLOWING compatible ones, stopping at the first incompatible
    one (vLLM-Omni's FIFO). 'grouped': the oldest request plus any later compatible ones (the head is still served
    first, so nothing starves): fuller batches on mixed traffic."""

    step_mode: bool = False
    """Step-level batching (docs/step_mode.md): the scheduler groups requests by their step key (which leaves out steps,
    guidance and output count) and sends compatible requests to a worker's running set, where they join at the next
    denoising step and leave when done; at most max_num_seqs requests per set. Workers whose pipeline has a step-mode
    adapter (Stable Diffusion 1.x/2.x, SD3) run sets; the others run each batch request-level, split by compatibility
    key. Off: request-level batching everywhere."""

    max_batch_pixels: int = Field(16_777_216, ge=64)
    """Per-batch pixel budget: the sum of n x width x height (x frames) over a batch's requests. The scheduler closes a
    batch before it exceeds it; the api refuses a request that alone exceeds it (422). Bounds the memory of one fused
    forward (16 Mi = 64 images of 512x512 or 16 of 1024x1024)."""

    scheduling_policy: SchedulingPolicy = "priority"
    """'priority': requests wait in levels by their priority, the highest non-empty level is served first, FIFO within a
    level, and a batch holds one level only. 'fcfs': one FIFO of arrival order, request priorities are ignored.
    'fair': the priority levels, and inside each deficit round robin over flows (a flow = the request's model and API
    key), weighted by the key's and the model's share, FIFO within a flow; in step mode a flow's waiting request also
    takes a full set's row from a flow running at least two more (a swap at one step boundary). Requests that all
    keep the default priority (and one key, one model) are served in arrival order in each."""

    default_priority: int = Field(
        0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description=f"Priority of a request that sets none ({PRIORITY_MIN} lowest .. {PRIORITY_MAX} highest).",
    )

    model_batching: Annotated[dict[str, ModelBatching], NoDecode, JsonObjectFromEnv] = Field(default_factory=dict)
    """Per-model engine args where a model differs from the fleet-wide ones: a JSON object, model name ->
    {max_num_seqs, request_batch_max_wait_ms, max_batch_pixels} (e.g. '{"pixart": {"max_num_seqs": 2}}'); the fleet
    config file sets them under [models.<name>]. A model not named batches by the fleet-wide settings."""

    @classmethod
    def validate_engine_arg(cls, name: str, value: object) -> object:
        """``value`` checked as the setting ``name`` (its type and bounds); a ValidationError otherwise."""
        return field_adapter(cls.model_fields[name]).validate_python(value)

    def batching_for(self, model: str) -> Self:
        """These settings as the batching policy of ``model`` reads them: its own engine args over the fleet's."""
        own = self.model_batching.get(model)
        return self.model_copy(update=own.given()) if own is not None else self

    @property
    def wait_stable_ms(self) -> float:
        """The admission wait's quiet window: dispatch when nothing arrived for this long."""
        return min(50.0, self.request_batch_max_wait_ms / 5.0)
