"""The HTTP api's request and response models: the api validates and answers with them, ``fusefleet.client``
and the webhook dispatcher (``scheduler.webhooks``) speak them. Pydantic only: importing this never loads the api.

The request is ``shared.contracts.SamplingParams`` (each sampling parameter declared once, with its fixed bounds:
shape multiples, guidance ranges, seed range) plus its inputs and webhook; ``Params`` echoes the parameters it
runs with (``RunParams``). Bounds that depend on the fleet's ``Settings`` (prompt length, image side, steps,
images per request, known LoRA adapters) are checked per request by ``api.limits`` and answered with the same 422
``detail`` format.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from shared.contracts import (
    DEFAULT_STRENGTH,
    RequestSpec,
    RequestState,
    RequestStatus,
    RunParams,
    SamplingParams,
    Strength,
    Task,
)
from shared.webhook_hosts import MAX_URL_CHARS, WebhookRefused, parse_url
from shared.webhooks import WebhookEvent

MAX_BATCH_ITEMS = 256

PROMPT_NOT_STRING = (
    "prompt must be a single string; submit each prompt as its own request "
    "(POST /v1/requests/batch takes a list of requests)"
)
BODY_NOT_OBJECT = (
    "the body must be one request object; to submit several requests at once, "
    'POST /v1/requests/batch with {"requests": [...]}'
)


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


class GenerateRequest(SamplingParams):
    """One request: ``n`` images for one prompt, from text alone or conditioned on an input image (and a mask).

    The task follows from the inputs: no ``image`` = text-to-image; ``image`` = image-to-image; ``image`` and
    ``mask_image`` = inpainting. Unknown fields are refused.
    """

    model_config = ConfigDict(
        json_schema_extra={"allOf": [*(_needs_image(f) for f in IMAGE_OPTIONS), LOSSY_ONLY, EVENTS_NEED_WEBHOOK]},
    )

    model: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="The model it is for, by name (GET /v1/models); unset = the fleet's default model. A name the "
        "fleet does not have is refused (422 naming model).",
    )
    image: str | None = Field(
        None,
        description="Input image (image-to-image, inpainting): base64 PNG, JPEG or WebP, or a data: URL. It is "
        "resized to width x height when its size differs.",
    )
    mask_image: str | None = Field(
        None, description="Inpainting mask, same encodings (white = repaint, black = keep); needs image."
    )
    strength: Strength | None = Field(
        None,
        description=f"Image tasks: how much of the input image is replaced (default {DEFAULT_STRENGTH}); needs image.",
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
        self,
        *,
        request_id: str,
        model: str,
        seed: int,
        created_at: float,
        default_priority: int = 0,
        default_strength: float | None = DEFAULT_STRENGTH,
    ) -> RequestSpec:
        """The stored spec of this request, with the seed it will run with (and ``default_priority`` when it sets
        none; an image task's ``default_strength``, None for a video model's image-to-video, which takes none)."""
        task = self.task
        resolved = {
            "id": request_id,
            "model": model,
            "seed": seed,
            "task": task,
            "strength": (self.strength or default_strength) if task.needs_image else None,
            "priority": self.priority if self.priority is not None else default_priority,
            "created_at": created_at,
        }
        return RequestSpec(**{name: getattr(self, name) for name in SamplingParams.model_fields} | resolved)


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


class Params(RunParams):
    """The sampling parameters the request runs with (echo of the submission, seed resolved). Every field is in
    every answer."""

    model_config = ConfigDict(extra="ignore", json_schema_serialization_defaults_required=True)


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
            params=Params.model_validate(spec, from_attributes=True),
        )


class Health(BaseModel):
    status: str


class ErrorMessage(BaseModel):
    """Every error answer except 422 (whose ``detail`` is a list of field errors): one readable ``detail``."""

    detail: str
