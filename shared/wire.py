"""The HTTP api's request and response models: the api validates and answers with them, ``fusefleet.client``
and the webhook dispatcher (``scheduler.webhooks``) speak them. Pydantic only: importing this never loads the api.

The bounds declared here are the fixed ones (shape multiples, guidance ranges, seed range). Bounds that
depend on the fleet's ``Settings`` (prompt length, image side, steps, images per request, known LoRA
adapters) are checked per request by ``api.limits`` and answered with the same 422 ``detail`` format.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from shared.contracts import (
    MAX_SEED,
    PRIORITY_MAX,
    PRIORITY_MIN,
    LoraRef,
    OutputFormat,
    RequestSpec,
    RequestState,
    RequestStatus,
    Task,
)
from shared.webhook_hosts import MAX_URL_CHARS, WebhookRefused, parse_url
from shared.webhooks import WebhookEvent

DEFAULT_SIDE = 64  # the built-in demo model's native size
DEFAULT_STEPS = 4  # enough for the demo model; real models usually want 20-50
MAX_BATCH_ITEMS = 256

PROMPT_NOT_STRING = (
    "prompt must be a single string; submit each prompt as its own request "
    "(POST /v1/requests/batch takes a list of requests)"
)
BODY_NOT_OBJECT = (
    "the body must be one request object; to submit several requests at once, "
    'POST /v1/requests/batch with {"requests": [...]}'
)


DEFAULT_STRENGTH = 0.8
IMAGE_FIELD_NEEDS_IMAGE = "{field} needs an input image: set image (base64 PNG, JPEG or WebP, or a data: URL)"
IMAGE_OPTIONS = ("mask_image", "strength")
WEBHOOK_EVENTS_NEED_WEBHOOK = "webhook_events needs a webhook: set webhook (the URL the events are POSTed to)"
COMPRESSION_NEEDS_LOSSY = (
    "output_compression is the quality of a lossy format: set output_format to jpeg or webp (png is lossless)"
)


LOSSY_ONLY: dict[str, Any] = {
    "if": {"required": ["output_compression"], "properties": {"output_compression": {"not": {"type": "null"}}}},
    "then": {"required": ["output_format"], "properties": {"output_format": {"enum": ["jpeg", "webp"]}}},
}
"""JSON Schema for "a non-null ``output_compression`` needs a lossy ``output_format``" (``_lossy_only``)."""


EVENTS_NEED_WEBHOOK: dict[str, Any] = {
    "if": {"required": ["webhook_events"], "properties": {"webhook_events": {"not": {"type": "null"}}}},
    "then": {"required": ["webhook"], "properties": {"webhook": {"type": "string"}}},
}
"""JSON Schema for "a non-null ``webhook_events`` needs a non-null ``webhook``" (``_needs_webhook``)."""


def _needs_image(field: str) -> dict[str, Any]:
    """JSON Schema for "a non-null ``field`` requires a non-null ``image``" (what ``_needs_image`` checks)."""
    return {
        "if": {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
        "then": {"required": ["image"], "properties": {"image": {"type": "string"}}},
    }


class GenerateRequest(BaseModel):
    """One request: ``n`` images for one prompt, from text alone or conditioned on an input image (and a mask).

    The task follows from the inputs: no ``image`` = text-to-image; ``image`` = image-to-image; ``image`` and
    ``mask_image`` = inpainting. Unknown fields are refused.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"allOf": [*(_needs_image(f) for f in IMAGE_OPTIONS), LOSSY_ONLY, EVENTS_NEED_WEBHOOK]},
    )

    prompt: str = Field(min_length=1, description="The text prompt (one string; one prompt per request).")
    negative_prompt: str | None = Field(None, description="What the image should not show.")
    width: int = Field(DEFAULT_SIDE, ge=8, multiple_of=8, strict=True, description="Pixels, multiple of 8.")
    height: int = Field(DEFAULT_SIDE, ge=8, multiple_of=8, strict=True, description="Pixels, multiple of 8.")
    num_inference_steps: int = Field(
        DEFAULT_STEPS,
        ge=1,
        strict=True,
        description=f"Denoising steps (default {DEFAULT_STEPS} suits the demo model; real ones want 20-50).",
    )
    guidance_scale: float = Field(5.0, ge=0.0, le=50.0, allow_inf_nan=False, strict=True)
    guidance_rescale: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False, strict=True)
    true_cfg_scale: float | None = Field(
        None,
        ge=1.0,
        le=50.0,
        allow_inf_nan=False,
        strict=True,
        description="Flux, Qwen-Image: true classifier-free guidance; above 1 the negative prompt is used too.",
    )
    max_sequence_length: int | None = Field(
        None, ge=1, strict=True, description="SD3, Flux, PixArt, Sana, Qwen-Image: prompt tokens the encoder reads."
    )
    num_frames: int | None = Field(None, ge=1, strict=True, description="Video models: frames per video.")
    fps: int | None = Field(None, ge=1, le=120, strict=True, description="Video models: frames per second.")
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, strict=True, description="Unset: the server picks one and reports it."
    )
    n: int = Field(1, ge=1, strict=True, description="Images generated for this prompt.")
    lora: LoraRef | None = Field(None, description="A LoRA adapter of the fleet's LoRA folder, by name.")
    image: str | None = Field(
        None,
        description="Input image (image-to-image, inpainting): base64 PNG, JPEG or WebP, or a data: URL. It is "
        "resized to width x height when its size differs.",
    )
    mask_image: str | None = Field(
        None, description="Inpainting mask, same encodings (white = repaint, black = keep); needs image."
    )
    strength: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        strict=True,
        description=f"Image tasks: how much of the input image is replaced (default {DEFAULT_STRENGTH}); needs image.",
    )
    output_format: OutputFormat = Field(OutputFormat.PNG, description="Encoding of the images: png, jpeg or webp.")
    output_compression: int | None = Field(
        None,
        ge=0,
        le=100,
        strict=True,
        description="jpeg and webp: quality, 0-100 (default 90); not for png.",
    )
    priority: int | None = Field(
        None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        strict=True,
        description=f"Scheduling priority, {PRIORITY_MIN} (lowest) to {PRIORITY_MAX} (highest): higher levels are "
        "served first, in arrival order within a level. Unset: the fleet's default_priority (0).",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        strict=True,
        description="Seconds from submission: not started by then, it fails with error Timeout; still running then, "
        "it is aborted (error Timeout). At most the fleet's max_timeout_s. Unset: no deadline.",
    )
    webhook: str | None = Field(
        None,
        max_length=MAX_URL_CHARS,
        description="http(s) URL the fleet POSTs this request's events to (webhook_events), signed with the fleet's "
        "webhook_secret (header Fusefleet-Signature) and retried until a 2xx answer; its host must be allowed by the "
        "fleet's webhook_allowed_hosts (and resolve to a public address unless listed). Not part of batching.",
    )
    webhook_events: list[WebhookEvent] | None = Field(
        None,
        min_length=1,
        description="Which events are POSTed to webhook: start (a worker began running it), progress (denoising "
        "steps, at most one a second), completed (succeeded, failed or aborted, with the request's state). "
        "Default: completed only. Needs webhook.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_object(cls, data: Any) -> Any:
        if isinstance(data, list):
            raise PydanticCustomError("request_not_object", BODY_NOT_OBJECT)
        return data

    @field_validator(
        "width",
        "height",
        "num_inference_steps",
        "seed",
        "n",
        "output_compression",
        "max_sequence_length",
        "num_frames",
        "fps",
        "priority",
        mode="before",
    )
    @classmethod
    def _integral_number(cls, value: Any) -> Any:
        """A JSON number with no fraction (``512.0``) is an integer (as JSON Schema has it); strings, booleans
        and fractions are still refused by the strict integer fields."""
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _single_prompt(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise PydanticCustomError("prompt_not_string", PROMPT_NOT_STRING)
        return value

    @field_validator("mask_image", "strength", mode="after")
    @classmethod
    def _needs_image(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("image") is None:
            raise PydanticCustomError("image_required", IMAGE_FIELD_NEEDS_IMAGE, {"field": info.field_name})
        return value

    @field_validator("output_compression", mode="after")
    @classmethod
    def _lossy_only(cls, value: int | None, info: ValidationInfo) -> int | None:
        output_format = info.data.get("output_format")
        if value is not None and output_format is not None and not output_format.lossy:
            raise PydanticCustomError("compression_needs_lossy", COMPRESSION_NEEDS_LOSSY)
        return value

    @field_validator("webhook", mode="after")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        """The URL's form (scheme, host, no user info); whether its host is allowed is ``api.webhook_urls``'s."""
        if value is not None:
            try:
                parse_url(value)
            except WebhookRefused as exc:
                raise PydanticCustomError("webhook_url", str(exc)) from None
        return value

    @field_validator("webhook_events", mode="after")
    @classmethod
    def _needs_webhook(cls, value: list[WebhookEvent] | None, info: ValidationInfo) -> list[WebhookEvent] | None:
        if value is not None and "webhook" in info.data and info.data["webhook"] is None:
            raise PydanticCustomError("webhook_required", WEBHOOK_EVENTS_NEED_WEBHOOK)
        return value

    @property
    def task(self) -> Task:
        if self.image is None:
            return Task.TEXT_TO_IMAGE
        return Task.INPAINT if self.mask_image is not None else Task.IMAGE_TO_IMAGE

    def to_spec(
        self, *, request_id: str, model: str, seed: int, created_at: float, default_priority: int = 0
    ) -> RequestSpec:
        """The stored spec of this request, with the seed it will run with (and ``default_priority`` when it sets
        none)."""
        return RequestSpec(
            id=request_id,
            model=model,
            prompt=self.prompt,
            negative_prompt=self.negative_prompt,
            seed=seed,
            width=self.width,
            height=self.height,
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            guidance_rescale=self.guidance_rescale,
            true_cfg_scale=self.true_cfg_scale,
            max_sequence_length=self.max_sequence_length,
            num_frames=self.num_frames,
            fps=self.fps,
            n=self.n,
            lora=self.lora,
            task=self.task,
            strength=(self.strength or DEFAULT_STRENGTH) if self.task.needs_image else None,
            output_format=self.output_format,
            output_compression=self.output_compression,
            priority=self.priority if self.priority is not None else default_priority,
            timeout_s=self.timeout_s,
            created_at=created_at,
        )


class BatchRequest(BaseModel):
    """Several independent requests submitted together, all accepted or none."""

    model_config = ConfigDict(extra="forbid")

    requests: list[GenerateRequest] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class Accepted(BaseModel):
    """Answer to a single submission."""

    id: str
    status: RequestStatus = RequestStatus.QUEUED


class BatchAccepted(BaseModel):
    """Answer to a batch submission: the ids in the order of the submitted requests."""

    ids: list[str]


class AbortResult(BaseModel):
    """Status after an abort: ``aborted``, or ``running`` while the worker winds the request down."""

    id: str
    status: RequestStatus


class Progress(BaseModel):
    step: int
    total: int


class ErrorView(BaseModel):
    type: str
    message: str


class Params(BaseModel):
    """The sampling parameters the request runs with (echo of the submission, seed resolved)."""

    model: str
    prompt: str
    negative_prompt: str | None
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    guidance_rescale: float
    true_cfg_scale: float | None
    max_sequence_length: int | None
    num_frames: int | None
    fps: int | None
    seed: int
    n: int
    lora: LoraRef | None
    task: Task
    strength: float | None
    output_format: OutputFormat
    output_compression: int | None
    priority: int = Field(description="The scheduling priority it waits at (the fleet's default when unset).")
    timeout_s: float | None = Field(description="Its timeout: the deadline is created_at + timeout_s.")


def _utc(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, tz=UTC) if timestamp is not None else None


class RequestView(BaseModel):
    """The public state of one request.

    ``progress.total`` is the worker's reported step count once running, else the requested steps.
    ``images`` lists relative URLs of the images (in ``params.output_format``; a video request's frames, video by
    video), ``videos`` those of a video request's MP4s, only once the request succeeded and while they are stored;
    ``images_evicted_at`` says when the Redis result store's size cap dropped them.
    """

    id: str
    status: RequestStatus
    seed: int
    batch_id: str | None
    batch_size: int | None
    worker: str | None
    progress: Progress
    error: ErrorView | None
    images: list[str]
    videos: list[str] = Field(
        default_factory=list, description="Video models: URLs of the MP4s (their frames are in images, video by video)."
    )
    images_evicted_at: datetime | None = None
    created_at: datetime | None
    scheduled_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    params: Params

    @classmethod
    def from_state(cls, state: RequestState) -> RequestView:
        spec = state.spec
        images: list[str] = []
        videos: list[str] = []
        if state.status is RequestStatus.SUCCEEDED and state.results_evicted_at is None:
            images = [f"/v1/requests/{spec.id}/images/{k}" for k in range(state.image_count)]
            videos = [f"/v1/requests/{spec.id}/videos/{k}" for k in range(len(state.video_keys))]
        return cls(
            id=spec.id,
            status=state.status,
            seed=spec.seed,
            batch_id=state.batch_id,
            batch_size=state.batch_size,
            worker=state.worker,
            progress=Progress(step=state.step, total=state.total or spec.num_inference_steps),
            error=ErrorView(type=state.error.type, message=state.error.message) if state.error else None,
            images=images,
            videos=videos,
            images_evicted_at=_utc(state.results_evicted_at),
            created_at=_utc(spec.created_at),
            scheduled_at=_utc(state.scheduled_at),
            started_at=_utc(state.started_at),
            finished_at=_utc(state.finished_at),
            params=Params(
                model=spec.model,
                prompt=spec.prompt,
                negative_prompt=spec.negative_prompt,
                width=spec.width,
                height=spec.height,
                num_inference_steps=spec.num_inference_steps,
                guidance_scale=spec.guidance_scale,
                guidance_rescale=spec.guidance_rescale,
                true_cfg_scale=spec.true_cfg_scale,
                max_sequence_length=spec.max_sequence_length,
                num_frames=spec.num_frames,
                fps=spec.fps,
                seed=spec.seed,
                n=spec.n,
                lora=spec.lora,
                task=spec.task,
                strength=spec.strength,
                output_format=spec.output_format,
                output_compression=spec.output_compression,
                priority=spec.priority,
                timeout_s=spec.timeout_s,
            ),
        )


class Health(BaseModel):
    status: str


class ErrorMessage(BaseModel):
    """Every error answer except 422 (whose ``detail`` is a list of field errors): one readable ``detail``."""

    detail: str
