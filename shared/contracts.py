"""Frozen pydantic models that cross a service boundary (API -> stream -> scheduler -> Celery -> worker).

Messages carry ids and parameters, never image bytes (an image-conditioned request's input image and mask are
stored once, in its request hash, and read by the worker that runs it). Every model is frozen and forbids unknown
fields, so a message produced by one version and read by another fails loudly instead of silently dropping data.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

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


class RequestSpec(Frozen):
    """Everything a worker needs to run one request: written once by the API, never changed afterwards."""

    id: str
    model: str = Field(description="Model the request is for (the fleet's FUSEFLEET_MODEL, or 'demo').")
    prompt: str
    negative_prompt: str | None = None
    seed: int = Field(ge=0, le=MAX_SEED)
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    guidance_rescale: float = 0.0
    true_cfg_scale: float | None = Field(
        None, description="True classifier-free guidance (Flux, Qwen-Image): > 1 runs the negative prompt too."
    )
    max_sequence_length: int | None = Field(None, description="Prompt tokens the T5-style encoder reads.")
    num_frames: int | None = Field(None, description="Video models: frames per video.")
    fps: int | None = Field(None, description="Video models: frames per second of the video.")
    n: int = 1
    lora: LoraRef | None = None
    task: Task = Task.TEXT_TO_IMAGE
    strength: float | None = Field(
        None, description="Image tasks: how much of the input image is replaced (0 < strength <= 1)."
    )
    output_format: OutputFormat = OutputFormat.PNG
    output_compression: int | None = Field(
        None, ge=0, le=100, description="JPEG/WebP quality, 0-100 (unset = the encoder's default)."
    )
    priority: int = Field(
        0, ge=PRIORITY_MIN, le=PRIORITY_MAX, description="Scheduling level: higher first, FIFO within a level."
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Seconds after created_at by which it must have started (None: no deadline)."
    )
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


class WorkerCapabilities(Frozen):
    """What a worker announces about the model it serves (with its heartbeat): the api refuses up front what no
    live worker can do."""

    model: str = Field(description="The model it serves (FUSEFLEET_MODEL, or 'demo').")
    pipeline: str = Field(description="Its pipeline (or runner) class, for messages.")
    tasks: tuple[Task, ...] = Field(description="The tasks its runner does.")
    traits: ModelTraits = Field(default_factory=ModelTraits, description="What its pipeline family takes.")


class BatchMessage(Frozen):
    """The Celery task payload: which requests to run together. Their specs are read from Redis by id."""

    batch_id: str
    request_ids: tuple[str, ...] = Field(min_length=1)
    created_at: float


class StepEviction(Frozen):
    """Step mode: a message in a worker's inbox (beside ``BatchMessage``s) asking its running set to evict request
    ``evict`` at the next step boundary and requeue it (``step_evict.lua``, ``requeue.lua``): a request of a higher
    level waits for its room."""

    evict: str = Field(min_length=1)


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
