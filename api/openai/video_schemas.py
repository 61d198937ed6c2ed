"""Bodies and answers of the OpenAI Videos API, and how a video call maps onto one native ``GenerateRequest``.

Pure: no I/O. ``api.openai.videos`` reads the body (JSON, or the multipart form the ``openai`` client sends) and the
served model's ``ModelTraits`` (what its workers announce) and calls ``VideoCreateRequest.native``.

What maps to what (docs/api.md#openai-videos-api says it for users):

- ``size`` ``"WIDTHxHEIGHT"`` -> ``width``, ``height``: each side a multiple of the model's ``size_multiple`` (32 for
  LTX-Video), between that and the fleet's ``max_image_side``; absent or ``"auto"``: the native default (64x64);
- ``seconds`` (OpenAI sends a string, ``"4"``; a number is taken too) -> ``num_frames``: the frame count the model
  takes (``frames_multiple`` k + 1) nearest to ``seconds x fps`` (ties to the longer clip), at least one frame;
  absent: the model's ``default_frames``. ``fps`` (an extension) defaults to the model's ``default_fps``; both are
  set explicitly on the native request, so the stored parameters say what ran;
- the answer's ``seconds`` is the clip's played duration, ``num_frames / fps`` (the frame rule may round what was
  asked: ``"1"`` at 8 fps is 9 frames, ``"1.125"``);
- ``model``: one of the fleet's models (``GET /v1/models``; 404 ``model_not_found`` otherwise) that makes videos,
  passed on natively, or absent for the fleet's default model; ``n`` is refused (one video per job);
- ``input_reference`` (an uploaded file of the multipart form, or ``{"image_url": "data:..."}``; a bare base64
  string or ``data:`` URL too) -> the native ``image``: image-to-video, its first frame, validated and bounded as
  every input image (``api.input_images``: resized to ``size``). A remote URL or a ``file_id`` is refused (this
  server fetches nothing and has no Files API), as is a model without image-to-video (its ``task_unsupported``);
- extensions with their native meaning and bounds: ``seed``, ``num_inference_steps``, ``guidance_scale``,
  ``negative_prompt``, ``fps``, ``priority``, ``timeout_s``, ``webhook``, ``webhook_events``.

Every refusal is an OpenAI 400 naming ``param`` in OpenAI's terms: a native error at ``num_frames`` is reported at
``seconds``, one at ``image`` at ``input_reference``, one at ``width`` or ``height`` at ``size`` (``relocated``).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from fastapi import status
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.openai.errors import OpenAIError, invalid_request, model_not_found
from api.openai.generation import CLIENT_FAULTS
from shared.contracts import DEFAULT_SIDE, TIMEOUT_ERROR, ModelTraits, RequestState, RequestStatus
from shared.settings import Settings
from shared.wire import GenerateRequest

AUTO_SIZE = "auto"
_SIZE = re.compile(r"(\d{1,6})x(\d{1,6})")
PASSED_ON = (
    "model",
    "prompt",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "priority",
    "timeout_s",
    "webhook",
    "webhook_events",
)
"""The native parameters a video call takes under their native names, passed on as sent (validated natively)."""
PARAM_OF_VIDEO_FIELD: Mapping[str, str] = {"num_frames": "seconds", "image": "input_reference"}
"""Native fields a video call sets under another OpenAI name (``width`` / ``height`` -> ``size`` as for images)."""
VideoStatus = Literal["queued", "in_progress", "completed", "failed"]
STATUS_OF: Mapping[RequestStatus, VideoStatus] = {
    RequestStatus.QUEUED: "queued",
    RequestStatus.SCHEDULED: "queued",
    RequestStatus.RUNNING: "in_progress",
    RequestStatus.SUCCEEDED: "completed",
    RequestStatus.FAILED: "failed",
    RequestStatus.ABORTED: "failed",
}
"""A native status as a video job's: scheduled is still queued (not started), failed and aborted are failed."""


def bad_param(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(status.HTTP_400_BAD_REQUEST, message, param=param, code=code)


def relocated(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Native validation errors with their ``loc`` in a video call's terms (``num_frames`` -> ``seconds``)."""
    out: list[dict[str, Any]] = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if len(loc) >= 2 and loc[0] == "body" and loc[1] in PARAM_OF_VIDEO_FIELD:
            loc = ("body", PARAM_OF_VIDEO_FIELD[str(loc[1])], *loc[2:])
        out.append({**error, "loc": loc})
    return out


REFERENCE_KEYS = frozenset({"image_url", "file_id"})
"""The keys of OpenAI's reference object (``ImageInputReferenceParam``)."""


def reference_image(reference: Any) -> str:
    """The native ``image`` (base64 or a ``data:`` URL) of ``input_reference``: an upload's bytes, a base64 string
    or ``data:`` URL, or ``{"image_url": ...}`` holding one; an OpenAI 400 naming ``input_reference`` otherwise.
    Its content is checked natively (``api.input_images``) once the request is submitted."""
    if isinstance(reference, bytes):
        return base64.b64encode(reference).decode()
    if isinstance(reference, Mapping):
        unknown = sorted(str(key) for key in reference if key not in REFERENCE_KEYS)
        if unknown:
            raise bad_param(
                "input_reference", f"Unknown parameter: 'input_reference.{unknown[0]}'.", "unknown_parameter"
            )
        if reference.get("file_id") is not None:
            raise bad_param(
                "input_reference",
                "input_reference.file_id is not supported: this server has no Files API; upload the image or send "
                "it as a data: URL in input_reference.image_url.",
                "unsupported_parameter",
            )
        reference = reference.get("image_url")
    if not isinstance(reference, str) or not reference.strip():
        raise bad_param(
            "input_reference",
            "Invalid value for 'input_reference': upload an image file, or send {'image_url': 'data:image/png;"
            "base64,...'}.",
            "invalid_type",
        )
    if reference.strip().lower().startswith(("http://", "https://")):
        raise bad_param(
            "input_reference",
            "input_reference.image_url must be a data: URL (base64): this server does not fetch remote images.",
            "unsupported_parameter",
        )
    return reference


def size_of(size: str | None, traits: ModelTraits, max_side: int) -> tuple[int, int]:
    """``(width, height)`` of ``size``; an OpenAI 400 naming ``size`` when the model cannot make it."""
    if size is None or size.strip().lower() == AUTO_SIZE:
        return DEFAULT_SIDE, DEFAULT_SIDE
    step = traits.size_multiple
    match = _SIZE.fullmatch(size.strip())
    sides = [int(side) for side in match.groups()] if match else []
    if not sides or any(side < step or side > max_side or side % step for side in sides):
        raise bad_param(
            "size",
            f"Invalid value for 'size': {size!r}. Use 'WIDTHxHEIGHT' (or 'auto' = {DEFAULT_SIDE}x{DEFAULT_SIDE}) "
            f"with each side a multiple of {step} (this fleet's model, {traits.family}) between {step} and "
            f"{max_side} (this server's max_image_side).",
        )
    return sides[0], sides[1]


def seconds_value(seconds: Any) -> Decimal:
    """``seconds`` as sent (``"4"``, ``4``, ``"2.5"``) as a positive number; an OpenAI 400 naming it otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, str | int | float):
        raise bad_param(
            "seconds", f"Invalid type for 'seconds': {seconds!r}; send a number of seconds, e.g. '4'.", "invalid_type"
        )
    try:
        value = Decimal(str(seconds).strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value <= 0:
        raise bad_param("seconds", f"Invalid value for 'seconds': {seconds!r}; it must be a positive number.")
    return value


def frames_for(seconds: Decimal, fps: int, frames_multiple: int) -> int:
    """The frame count a model with ``frames_multiple`` takes (``frames_multiple`` k + 1, k >= 0) nearest to
    ``seconds`` x ``fps`` frames; a tie goes to the longer clip."""
    wanted = seconds * fps
    k = math.floor((wanted - 1) / frames_multiple + Decimal("0.5"))
    return max(k, 0) * frames_multiple + 1


def played_seconds(num_frames: int, fps: int) -> str:
    """A clip's duration as the answer's ``seconds`` states it: ``num_frames / fps``, no trailing zeros."""
    text = f"{Decimal(num_frames) / Decimal(fps):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class VideoCreateRequest(BaseModel):
    """``POST /v1/videos``: the JSON body, or the multipart form's fields. Unknown parameters are refused (400
    ``unknown_parameter``); native fields are passed on as sent and validated natively."""

    model_config = ConfigDict(extra="forbid")

    prompt: Any = Field(description="The text prompt (one string).")
    model: str | None = Field(None, description="One of the fleet's models (GET /v1/models); omit it for its default.")
    size: str | None = Field(None, description="'WIDTHxHEIGHT', each side a multiple of the model's size multiple.")
    seconds: Any = Field(None, description="Clip length in seconds; frames follow the model's frame rule.")
    input_reference: Any = Field(
        None, description="Image-to-video: the first frame (an upload, or {'image_url': a data: URL})."
    )
    user: str | None = Field(None, description="Accepted and ignored.")
    fps: Any = Field(None, description="Frames per second (1-120); the model's default when absent.")
    negative_prompt: Any = None
    num_inference_steps: Any = None
    guidance_scale: Any = None
    seed: Any = None
    priority: Any = None
    timeout_s: Any = None
    webhook: Any = None
    webhook_events: Any = None

    def served_model(self, settings: Settings) -> str:
        """The model this call is for (its ``model``, else the fleet's default); 404 ``model_not_found`` for a
        model the fleet does not have."""
        if self.model is not None and self.model not in settings.catalog:
            raise model_not_found(self.model, settings.catalog)
        return self.model or settings.model_id

    def native(self, settings: Settings, traits: ModelTraits) -> GenerateRequest:
        """The native request of this call on its video model (``served_model``), whose traits are ``traits``, or
        the OpenAI 400 naming what it cannot do."""
        self.served_model(settings)
        width, height = size_of(self.size, traits, settings.max_image_side)
        fps = self.fps if self.fps is not None else traits.default_fps
        fields: dict[str, Any] = {name: getattr(self, name) for name in PASSED_ON}
        fields.update(width=width, height=height, fps=fps, num_frames=traits.default_frames)
        if self.input_reference is not None:
            fields["image"] = reference_image(self.input_reference)
        if self.seconds is not None:
            seconds = seconds_value(self.seconds)
            if fps is None:
                raise bad_param("fps", f"Missing 'fps': {traits.family} has no default frame rate to time 'seconds'.")
            rate = _whole(fps)  # a bad fps gets no frames: the native validation below names it
            fields["num_frames"] = frames_for(seconds, rate, traits.frames_multiple) if rate else None
        return native_video_request(fields)


def _whole(value: Any) -> int | None:
    """A frame rate as sent, when it is a whole positive number (``8`` or ``8.0``); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if value < 1 or value != int(value):
        return None
    return int(value)


def native_video_request(fields: Mapping[str, Any]) -> GenerateRequest:
    """The native request of ``fields`` (None = native default), or an OpenAI 400 naming the parameter."""
    present = {name: value for name, value in fields.items() if value is not None}
    try:
        return GenerateRequest.model_validate(present)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise invalid_request(relocated(errors)) from None


class VideoCreateForm(VideoCreateRequest):
    """The multipart form of ``POST /v1/videos`` (what ``client.videos.create`` sends, ``extra_body`` fields
    included): every value is text, so the native numbers are read as numbers here."""

    fps: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    priority: int | None = None
    timeout_s: float | None = None
    webhook_events: list[str] | None = None


class VideoError(BaseModel):
    """Why a job failed: ``code`` (``aborted``, ``timeout``, ``invalid_input``, ``generation_failed``) and the
    native error's type and message."""

    code: str
    message: str


class Video(BaseModel):
    """OpenAI's Video object of one job (= one native request, same id)."""

    id: str
    object: Literal["video"] = "video"
    status: VideoStatus
    progress: int = Field(ge=0, le=100)
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    error: VideoError | None = None
    model: str
    prompt: str
    seconds: str
    size: str


class VideoList(BaseModel):
    """A page of ``GET /v1/videos``, OpenAI's cursor-list shape."""

    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class VideoDeleted(BaseModel):
    """The answer to ``DELETE /v1/videos/{id}``: ``deleted`` false when the job was still unfinished and is aborted
    instead (it stays, ``failed`` with code ``aborted``, until deleted again)."""

    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool


def progress_of(state: RequestState) -> int:
    """0-100 from the live step count (100 once completed)."""
    if state.status is RequestStatus.SUCCEEDED:
        return 100
    total = state.total or state.spec.num_inference_steps
    return max(0, min(100, (100 * state.step) // total)) if total else 0


def error_of(state: RequestState) -> VideoError | None:
    """The job's error once it failed or was aborted: ``aborted`` (by a DELETE or the native abort),
    ``timeout`` (its ``timeout_s``), ``invalid_input`` (what it asked for) or ``generation_failed``."""
    if state.status not in (RequestStatus.FAILED, RequestStatus.ABORTED):
        return None
    error_type = state.error.type if state.error else None
    if state.status is RequestStatus.ABORTED and error_type != TIMEOUT_ERROR:
        return VideoError(code="aborted", message=f"video {state.spec.id} was aborted before it finished")
    message = f"{error_type or 'Error'}: {state.error.message if state.error else 'no reason recorded'}"
    if error_type == TIMEOUT_ERROR:
        code = "timeout"
    else:
        code = "invalid_input" if error_type in CLIENT_FAULTS else "generation_failed"
    return VideoError(code=code, message=message)


def video_of(state: RequestState, result_ttl_s: int) -> Video:
    """The Video object of a native request's state (its frames and fps are set: ``VideoCreateRequest.native``)."""
    spec = state.spec
    finished = state.finished_at if state.status.terminal else None
    frames, fps = spec.num_frames or 1, spec.fps or 1
    return Video(
        id=spec.id,
        status=STATUS_OF[state.status],
        progress=progress_of(state),
        created_at=int(spec.created_at),
        completed_at=int(finished) if finished is not None else None,
        expires_at=int(finished + result_ttl_s) if finished is not None else None,
        error=error_of(state),
        model=spec.model,
        prompt=spec.prompt,
        seconds=played_seconds(frames, fps),
        size=f"{spec.width}x{spec.height}",
    )
