"""Frozen pydantic models that cross a service boundary (API -> stream -> scheduler -> Celery -> worker).

Messages carry ids and parameters, never image bytes (an image-conditioned request's input image and mask are
stored once, in its request hash, and read by the worker that runs it). Every model is frozen and forbids unknown
fields, so a message produced by one version and read by another fails loudly instead of silently dropping data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

MAX_SEED = 2**63 - 1
PRIORITY_MIN = -2
PRIORITY_MAX = 2
"""A request's ``priority`` levels: higher levels are served first, FIFO within a level; 0 is normal."""
TIMEOUT_ERROR = "Timeout"
"""``error.type`` of a request that reached its deadline (``RequestSpec.deadline``): failed before it started, or
aborted while running (``scheduler.deadlines``, ``expire.lua``)."""
VIDEO_EXTENSION = "mp4"
"""The extension (and container) of a video result; its frames are images in the request's ``output_format``."""


class Frozen(BaseModel):
    """Base of every boundary model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class RequestStatus(StrEnum):
    """Life cycle of one request. It only moves forward: queued < scheduled < running < a terminal status."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.ABORTED})


class Task(StrEnum):
    """What a request asks of the pipeline; derived from the inputs it carries (an image, and a mask)."""

    TEXT_TO_IMAGE = "text-to-image"
    IMAGE_TO_IMAGE = "image-to-image"
    INPAINT = "inpaint"

    @property
    def needs_image(self) -> bool:
        return self is not Task.TEXT_TO_IMAGE


class OutputFormat(StrEnum):
    """How a request's images are encoded (its ``output_format``); the value is also the file extension."""

    PNG = "png"
    JPEG = "jpeg"
    WEBP = "webp"

    @property
    def media_type(self) -> str:
        return f"image/{self.value}"

    @property
    def lossy(self) -> bool:
        """Whether ``output_compression`` (a quality, 0-100) applies."""
        return self is not OutputFormat.PNG


class LoraRef(Frozen):
    """One LoRA adapter (a sub-folder of the LoRA folder) applied at ``scale``."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    scale: float = Field(1.0, ge=-10.0, le=10.0, strict=True)


DEFAULT_SIDE = 64  # the built-in demo model's native size
DEFAULT_STEPS = 4  # enough for the demo model; real models usually want 20-50
DEFAULT_STRENGTH = 0.8
"""An image task's ``strength`` when its request sets none."""


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Field marker, ``Annotated[..., BatchKey()]``: the field is part of the batch keys (``shared.compat``).

    ``forward``: in the compatibility key (one value for a whole fused pipeline call); ``step``: in the step key
    (one value for a whole running set; a step-engine row carries its steps, guidance and outputs itself).
    ``presence``: the keys hold only whether it is set (``has_<name>``); ``parts``: they hold these attributes of
    its value (``<name>_<part>``, None when unset) instead of the value. ``row_task``: it leaves the step key (None
    there) for a request whose task its model's step rows carry themselves (``ModelTraits.step_tasks``).
    """

    forward: bool = True
    step: bool = True
    presence: bool = False
    parts: tuple[str, ...] = ()
    row_task: bool = False


def _integral(value: Any) -> Any:
    """A JSON number with no fraction (``512.0``) is an integer, as JSON Schema has it; strings, booleans and
    fractions are left to the strict integer to refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Each integer's bounds come before ``_integral`` in its one ``Annotated``: bounds added after a validator (on the
# field, or in an outer ``Annotated``) are still enforced, but pydantic then leaves them out of the JSON schema
# (``tests/unit/test_openapi_bounds.py``), and schema-driven clients and fuzzers would send what the api refuses.
Side = Annotated[int, Field(strict=True, ge=8, multiple_of=8), BeforeValidator(_integral)]
Count = Annotated[int, Field(strict=True, ge=1), BeforeValidator(_integral)]
Fps = Annotated[int, Field(strict=True, ge=1, le=120), BeforeValidator(_integral)]
Quality = Annotated[int, Field(strict=True, ge=0, le=100), BeforeValidator(_integral)]
Seed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED), BeforeValidator(_integral)]
Priority = Annotated[int, Field(strict=True, ge=PRIORITY_MIN, le=PRIORITY_MAX), BeforeValidator(_integral)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Strength = Annotated[Number, Field(gt=0.0, le=1.0)]


class SamplingParams(Frozen):
    """What a request asks the pipeline for: every sampling parameter, declared once with its fixed bounds.

    The HTTP request (``shared.wire.GenerateRequest``) is this model plus its inputs and webhook; the parameters
    a request runs with (``RunParams``, echoed as ``shared.wire.Params``) are it as the api resolved it, and the
    stored ``RequestSpec`` adds the request's id. Bounds that depend on the fleet's settings are ``api.limits``'s.
    A field marked ``BatchKey`` is in the batch keys, which ``shared.compat`` derives from the markers.
    """

    prompt: str = Field(min_length=1, description="The text prompt (one string; one prompt per request).")
    negative_prompt: Annotated[str | None, BatchKey(step=False, presence=True)] = Field(
        None, description="What the image should not show."
    )
    width: Annotated[Side, BatchKey()] = Field(DEFAULT_SIDE, description="Pixels, multiple of 8.")
    height: Annotated[Side, BatchKey()] = Field(DEFAULT_SIDE, description="Pixels, multiple of 8.")
    num_frames: Annotated[Count | None, BatchKey()] = Field(None, description="Video models: frames per video.")
    num_inference_steps: Annotated[Count, BatchKey(step=False)] = Field(
        DEFAULT_STEPS,
        description=f"Denoising steps (default {DEFAULT_STEPS} suits the demo model; real ones want 20-50).",
    )
    guidance_scale: Annotated[Number, BatchKey(step=False)] = Field(5.0, ge=0.0, le=50.0)
    guidance_rescale: Annotated[Number, BatchKey(step=False)] = Field(0.0, ge=0.0, le=1.0)
    true_cfg_scale: Annotated[Number | None, BatchKey(step=False)] = Field(
        None,
        ge=1.0,
        le=50.0,
        description="Models with true classifier-free guidance: above 1 the negative prompt is used too.",
    )
    max_sequence_length: Annotated[Count | None, BatchKey()] = Field(
        None, description="Models with a T5-style text encoder: prompt tokens the encoder reads."
    )
    fps: Annotated[Fps | None, BatchKey()] = Field(None, description="Video models: frames per second.")
    seed: Seed | None = Field(None, description="Unset: the server picks one and reports it.")
    n: Annotated[Count, BatchKey(step=False)] = Field(1, description="Images generated for this prompt.")
    lora: LoraRef | None = Field(
        None, description="A LoRA adapter of the fleet's LoRA folder, by name."
    )
    output_format: OutputFormat = Field(OutputFormat.PNG, description="Encoding of the images: png, jpeg or webp.")
    output_compression: Quality | None = Field(
        None, description="jpeg and webp: quality, 0-100 (default 90); not for png."
    )
    priority: Priority | None = Field(
        None,
        description=f"Scheduling priority, {PRIORITY_MIN} (lowest) to {PRIORITY_MAX} (highest): higher levels are "
        "served first, in arrival order within a level. Unset: the fleet's default_priority (0).",
    )
    timeout_s: Number | None = Field(
        None,
        gt=0,
        description="Seconds from submission: not started by then, it fails with error Timeout; still running then, "
        "it is aborted (error Timeout). At most the fleet's max_timeout_s. Unset: no deadline.",
    )


class ServedModel(Frozen):
    """Which model a request is for. A base of ``RunParams`` so that it is their first field: the batch keys
    list their fields in field order, and a step key's digest (a Redis name) is of that list."""

    model: Annotated[str, BatchKey()] = Field(
        description="Model the request is for (the fleet's FUSEFLEET_MODEL, or 'demo')."
    )


class RunParams(SamplingParams, ServedModel):
    """The parameters a request runs with: its ``SamplingParams`` with what the api resolved (the seed, the task
    its inputs ask for, the strength and priority it runs at)."""

    seed: Seed = Field(description="The seed it runs with: the request's, or the one the server picked.")
    priority: Priority = Field(0, description="The scheduling priority it waits at (the fleet's default when unset).")
    task: Annotated[Task, BatchKey(row_task=True)] = Task.TEXT_TO_IMAGE
    strength: Annotated[Strength | None, BatchKey(row_task=True)] = Field(
        None, description="Image tasks: how much of the input image is replaced (0 < strength <= 1)."
    )


class RequestSpec(RunParams):
    """Everything a worker needs to run one request: written once by the API, never changed afterwards."""

    id: str
    created_at: float

    @property
    def deadline(self) -> float | None:
        """When it must have started (wall-clock seconds, ``created_at + timeout_s``); None without a timeout.

        Not started by then: it fails with ``Timeout``; still running then: it is aborted (``scheduler.deadlines``).
        """
        return None if self.timeout_s is None else self.created_at + self.timeout_s


class ModelTraits(Frozen):
    """What the served pipeline family does with a request's parameters; workers announce it, the api refuses a
    request that asks for what the model cannot do (422 naming the field). The defaults fit Stable Diffusion
    1.x/2.x and any runner that says nothing."""

    family: str = Field("custom", description="The pipeline family (e.g. stable-diffusion-xl, flux), for messages.")
    fused: bool = Field(True, description="Whether a batch runs as one forward (else request by request).")
    size_multiple: int = Field(8, ge=1, description="width and height must be multiples of this.")
    negative_prompt: bool = Field(True, description="Whether negative_prompt is used (without true_cfg_scale).")
    guidance_rescale: bool = Field(True, description="Whether guidance_rescale is used.")
    true_cfg_scale: bool = Field(False, description="Whether true_cfg_scale is taken (it enables negatives).")
    max_sequence_length: int | None = Field(
        None, description="Largest max_sequence_length the text encoder takes; None: not a parameter."
    )
    lora: bool = Field(True, description="Whether LoRA adapters can be loaded into the pipeline.")
    video: bool = Field(False, description="Whether outputs are videos (num_frames, fps).")
    frames_multiple: int = Field(1, ge=1, description="Video: num_frames must be a multiple of this, plus one.")
    default_frames: int | None = Field(None, description="Video: frames when a request sets none.")
    default_fps: int | None = Field(None, description="Video: fps when a request sets none.")
    step_tasks: tuple[Task, ...] = Field(
        (),
        description="The tasks a step-mode row of this model carries itself, with its strength (its step-engine "
        "adapter's): requests of these tasks share a running set; empty: task and strength stay in the step key.",
    )
    max_inference_steps: int | None = Field(
        None,
        ge=1,
        description="The largest num_inference_steps its scheduler runs (found by dry runs of it: "
        "gpu_worker.step_limit); None: any the fleet's max_inference_steps allows.",
    )
    approximate: str | None = Field(
        None,
        description="The approximate accelerations on this model (gpu_worker.approximations: step cache, weight "
        "quantization) and whether a row may depend on its peers; None: exact.",
    )


class BatchKnee(Frozen):
    """The largest batch of a model's requests of one pixel cost that still gains throughput on a worker
    (``gpu_worker.batch_knee``): the scheduler caps their batches there."""

    cost: int = Field(ge=1, description="The requests' pixel cost (shared.compat.pixel_cost).")
    knee: int = Field(ge=1, description="The largest batch of them that still gains throughput by the margin.")


class ModelCapabilities(Frozen):
    """What a worker announces about one model it serves (with its heartbeat): the api refuses up front what no
    live worker of that model can do."""

    model: str = Field(description="The model's name (FUSEFLEET_MODELS; one model: FUSEFLEET_MODEL, or 'demo').")
    pipeline: str = Field(description="Its pipeline (or runner) class, for messages.")
    tasks: tuple[Task, ...] = Field(description="The tasks its runner does.")
    traits: ModelTraits = Field(default_factory=ModelTraits, description="What its pipeline family takes.")
    resident: bool = Field(True, description="Whether its pipeline is loaded now (gpu_worker.residency).")
    load_s: float | None = Field(None, ge=0, description="Seconds its last load took on this worker (None: unknown).")
    batch_s: float | None = Field(
        None, ge=0, description="Seconds a batch of it takes on this worker, a moving average (None: none ran yet)."
    )
    batch_knees: tuple[BatchKnee, ...] = Field(
        (), description="Its batch knee by request pixel cost on this worker, where measured (gpu_worker.batch_knee)."
    )


class WorkerCapabilities(ModelCapabilities):
    """What a worker announces: its first model's capabilities (as a worker of one model always announced them),
    and every model it serves in ``models``."""

    models: tuple[ModelCapabilities, ...] = Field(
        (), description="Every model it serves, the first one included; empty (a worker of one model) = the first."
    )

    @property
    def served(self) -> tuple[ModelCapabilities, ...]:
        """Every model the worker serves."""
        first = ModelCapabilities(**{name: getattr(self, name) for name in ModelCapabilities.model_fields})
        return self.models or (first,)

    @classmethod
    def of(cls, models: tuple[ModelCapabilities, ...]) -> WorkerCapabilities:
        """The announcement of a worker serving ``models`` (at least one)."""
        return cls(**models[0].model_dump(), models=models)


class BatchMessage(Frozen):
    """The Celery task payload: which requests to run together. Their specs are read from Redis by id."""

    batch_id: str
    request_ids: tuple[str, ...] = Field(min_length=1)
    created_at: float
    model: str | None = None  # the model of its requests (a batch holds one); None from a scheduler before models


class StepEviction(Frozen):
    """Step mode: a message in a worker's inbox (beside ``BatchMessage``s) asking its running set to evict request
    ``evict`` at the next step boundary and requeue it (``step_evict.lua``, ``requeue.lua``): a request of a higher
    level waits for its room, or (``joiner``) a request of a flow that runs fewer rows takes it."""

    evict: str = Field(min_length=1)
    joiner: str | None = Field(
        default=None,
        min_length=1,
        description="The batch sent with it to take the room (step_swap.lua: the fair order's swap): the set evicts "
        "even once sealed, and holds that batch back a boundary when ``evict`` is in its last step.",
    )


class ErrorInfo(Frozen):
    """Why a request failed: the exception type and its message."""

    type: str
    message: str


class RequestState(Frozen):
    """The stored state of one request, as read back from Redis."""

    spec: RequestSpec
    status: RequestStatus
    batch_id: str | None = None
    batch_size: int | None = None
    step: int = 0
    total: int = 0
    error: ErrorInfo | None = None
    result_keys: tuple[str, ...] = Field((), description="Result-store keys of its images, once it succeeded.")
    results_evicted_at: float | None = Field(
        None, description="When the result store's size cap dropped its images (Redis result store only)."
    )
    worker: str | None = None
    scheduled_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def image_keys(self) -> tuple[str, ...]:
        """Its images' keys: every image of an image request; every frame, video by video, of a video request."""
        return tuple(key for key in self.result_keys if not key.endswith(f".{VIDEO_EXTENSION}"))

    @property
    def video_keys(self) -> tuple[str, ...]:
        """Its videos' keys (MP4), one per output of a video request."""
        return tuple(key for key in self.result_keys if key.endswith(f".{VIDEO_EXTENSION}"))

    @property
    def image_count(self) -> int:
        return len(self.image_keys)
