"""Frozen pydantic models that cross a service boundary (API -> stream -> scheduler -> Celery -> worker).

Messages carry ids and parameters, never image bytes (an image-conditioned request's input image and mask are
stored once, in its request hash, and read by the worker that runs it). Every model is frozen and forbids unknown
fields, so a message produced by one version and read by another fails loudly instead of silently dropping data.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

MAX_SEED = 2**63 - 1


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
    scale: float = Field(1.0, ge=-10.0, le=10.0)


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
    num_frames: int | None = None
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
    created_at: float


class WorkerCapabilities(Frozen):
    """What a worker announces about the model it serves (with its heartbeat): the api refuses up front what no
    live worker can do."""

    model: str = Field(description="The model it serves (FUSEFLEET_MODEL, or 'demo').")
    pipeline: str = Field(description="Its pipeline (or runner) class, for messages.")
    tasks: tuple[Task, ...] = Field(description="The tasks its runner does.")


class BatchMessage(Frozen):
    """The Celery task payload: which requests to run together. Their specs are read from Redis by id."""

    batch_id: str
    request_ids: tuple[str, ...] = Field(min_length=1)
    created_at: float


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
    def image_count(self) -> int:
        return len(self.result_keys)
