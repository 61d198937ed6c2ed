"""The OpenAI Videos API: ``/v1/videos``, asynchronous video jobs, each one ordinary native request (same id).

- ``POST /v1/videos`` (JSON, or the multipart form ``client.videos.create`` sends, ``input_reference`` an uploaded
  image: image-to-video): maps the call onto a native
  request by the served model's own rules (``api.openai.video_schemas``), submits it through the one submission
  path (``api.submission.accept``: limits, API key, webhook, the atomic ``SUBMIT``; batched with every other
  request) and answers the job's Video object, ``queued``. The job joins its owner's video list; when that write
  fails the request is aborted and the answer is 503, so every job a client was told of is listed.
- ``GET /v1/videos/{id}``: the Video object (status, progress from the live step count, error), with
  ``openai-poll-after-ms`` while it runs (the ``openai`` client's ``poll`` reads it).
- ``GET /v1/videos``: the caller's jobs, newest first (``order=asc``: oldest), ``limit`` 1-100 (default 20), from
  ``after``'s successor; OpenAI's cursor-list shape.
- ``GET /v1/videos/{id}/content``: the MP4 (``variant=thumbnail``: its first frame, in the request's output format),
  served as the native ``/v1/requests/{id}/video`` is (a 307 to a presigned URL with ``result_delivery=redirect``).
- ``DELETE /v1/videos/{id}``: a finished job is deleted (state and files: the native ``DELETE``); an unfinished one
  is aborted through the native abort and answered ``deleted: false``: it stays, ``failed`` with code ``aborted``,
  until deleted again.

With API keys a job is its submitter's: another key's id is a 404, and the list holds the caller's own only. Every
error is in OpenAI's shape (``api.openai.errors``).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile as StarletteUpload

from api import idempotency
from api.auth import CallerDep, OwnerDep
from api.capabilities import served_models
from api.deps import SettingsDep, StoreDep
from api.input_budget import InputsRefused
from api.openai.errors import SERVER_ERROR, OpenAIError, OpenAIRoute, invalid_request
from api.openai.generation import REQUEST_ID_HEADER
from api.openai.video_schemas import (
    Video,
    VideoCreateForm,
    VideoCreateRequest,
    VideoDeleted,
    VideoList,
    bad_param,
    relocated,
    video_of,
)
from api.outage import StoreUnavailable, retry_after_headers
from api.request_ids import is_request_id
from api.routes.requests import serve_result
from api.shard_router import Store
from api.store import Forgotten
from api.submission import accept
from shared.contracts import ModelTraits, RequestState, RequestStatus, WorkerCapabilities

router = APIRouter(prefix="/v1/videos", tags=["openai"], route_class=OpenAIRoute, include_in_schema=False)

POLL_AFTER_MS = 500
"""``openai-poll-after-ms`` of an unfinished job's answer: how soon the ``openai`` client polls again."""
DEFAULT_LIMIT, MAX_LIMIT = 20, 100
"""``GET /v1/videos``'s page size when ``limit`` is absent, and its largest."""
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
NESTED = re.compile(r"(?P<outer>\w+)\[(?P<inner>\w+)\]")
"""A form field of an object's key, ``input_reference[image_url]`` (how the ``openai`` client sends a dict)."""
VARIANTS: Mapping[str, str] = {"video": "video", "thumbnail": "image"}
"""``variant`` of ``/content`` -> the native result it serves: the MP4, or the first frame."""


def video_not_found(video_id: str) -> OpenAIError:
    return OpenAIError(
        status.HTTP_404_NOT_FOUND,
        f"Video '{video_id[:40]}' not found (unknown, expired, deleted or another key's).",
        code="video_not_found",
    )


def video_traits(fleet: list[WorkerCapabilities], model: str) -> ModelTraits:
    """The traits of ``model`` as its live workers announce them; a 503 while none does, a 400 naming ``model``
    when it makes images."""
    served = served_models(fleet).get(model, [])
    if not served:
        raise OpenAIError(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"no live worker serves model {model!r} yet, so its frame and size rules are unknown; retry later",
            kind=SERVER_ERROR,
            code="model_unavailable",
            headers=retry_after_headers(),
        )
    video = [capabilities.traits for capabilities in served if capabilities.traits.video]
    if not video:
        family = served[0].traits.family
        raise bad_param("model", f"Invalid value for 'model': {model!r} ({family}) makes images, not videos.")
    return video[0]


async def form_fields(request: Request) -> dict[str, Any]:
    """The fields of a form body: every value text (``webhook_events[]`` repeated: a list), an uploaded file's
    bytes (``input_reference``, read here: the body limit bounds it), ``input_reference[image_url]`` as the
    reference object's key."""
    form = await request.form()
    fields: dict[str, Any] = {}
    for name in form:
        values = form.getlist(name)
        if name.endswith("[]"):
            fields[name[:-2]] = [str(value) for value in values]
        elif (match := NESTED.fullmatch(name)) is not None:
            fields.setdefault(match["outer"], {})
            if isinstance(fields[match["outer"]], dict):
                fields[match["outer"]][match["inner"]] = str(values[-1])
        elif isinstance(values[-1], StarletteUpload):
            fields[name] = await values[-1].read()
        else:
            fields[name] = values[-1]
    return fields


async def create_body(request: Request) -> VideoCreateRequest:
    """The call's parameters: a JSON object, or a form (``form_fields``)."""
    content_type = request.headers.get("content-type", "").lower()
    try:
        if content_type.startswith(FORM_TYPES):
            return VideoCreateForm.model_validate(await form_fields(request))
        body = await request.body()
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise OpenAIError(
                status.HTTP_400_BAD_REQUEST,
                f"We could not parse the JSON body of your request ({exc})",
                code="invalid_json",
            ) from None
        if not isinstance(data, dict):
            raise bad_param("body", "The body must be a JSON object (or a multipart form).", "invalid_type")
        return VideoCreateRequest.model_validate(data)
    except ValidationError as exc:
        raise invalid_request([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None


@router.post("")
async def create_video(
    request: Request, settings: SettingsDep, store: StoreDep, caller: CallerDep, owner: OwnerDep
) -> JSONResponse:
    """Queue a video job: its Video object (``queued``), its id in ``x-request-id`` too."""
    body = await create_body(request)
    traits = video_traits(await store.fleet_capabilities(), body.served_model(settings))
    native = body.native(settings, traits)
    try:
        key = idempotency.parse_key(request.headers.get(idempotency.HEADER))
        submission = await accept([native], settings, store, [("body",)], caller, key)
        (spec,) = submission.specs
    except RequestValidationError as exc:
        raise invalid_request(relocated(exc.errors())) from None
    except InputsRefused as exc:  # the input budget: 413 or 429 at the reference image
        raise OpenAIError(
            exc.status_code, exc.message, param="input_reference", code=exc.code, headers=exc.headers
        ) from None
    try:
        await store.add_video(spec.id, spec.created_at, owner)
    except StoreUnavailable:
        if not submission.replayed:  # a replay's job is the first call's: it stays
            if submission.claim is not None:  # aborted below: a retry with the key submits afresh
                await submission.claim.release()
            with contextlib.suppress(StoreUnavailable):  # not aborted: it runs unlisted, and expires
                await store.abort(spec.id, time.time())
        raise
    state = await store.get(spec.id, owner) if submission.replayed else None  # replayed: as it stands now
    video = video_of(state or RequestState(spec=spec, status=RequestStatus.QUEUED), settings.result_ttl_s)
    headers = {REQUEST_ID_HEADER: spec.id, **submission.headers}
    return JSONResponse(video.model_dump(mode="json"), headers=headers)


async def _job(video_id: str, store: Store, owner: str | None) -> RequestState:
    """The state of video job ``video_id`` of ``owner``; the OpenAI 404 when there is none."""
    if not is_request_id(video_id) or not await store.is_video(video_id, owner):
        raise video_not_found(video_id)
    state = await store.get(video_id, owner)
    if state is None:
        raise video_not_found(video_id)
    return state


def _answer(video: Video) -> JSONResponse:
    headers = {REQUEST_ID_HEADER: video.id}
    if video.status in ("queued", "in_progress"):
        headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)
    return JSONResponse(video.model_dump(mode="json"), headers=headers)


@router.get("/{video_id}")
async def retrieve_video(video_id: str, settings: SettingsDep, store: StoreDep, owner: OwnerDep) -> JSONResponse:
    """The job's Video object."""
    return _answer(video_of(await _job(video_id, store, owner), settings.result_ttl_s))


def _limit(limit: str | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    try:
        value = int(limit)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise bad_param("limit", f"Invalid value for 'limit': {limit!r}; it must be an integer from 1 to {MAX_LIMIT}.")
    return value


@router.get("")
async def list_videos(
    settings: SettingsDep,
    store: StoreDep,
    owner: OwnerDep,
    after: str | None = None,
    limit: str | None = None,
    order: str | None = None,
) -> VideoList:
    """A page of the caller's jobs, newest first unless ``order=asc``."""
    if order not in (None, "asc", "desc"):
        raise bad_param("order", f"Invalid value for 'order': {order!r}; use 'asc' or 'desc'.")
    size = _limit(limit)
    page = await store.video_page(owner, after, size, newest_first=order != "asc")
    if page is None:
        raise bad_param("after", f"Invalid value for 'after': {(after or '')[:40]!r} is not one of your videos.")
    states, more = page
    data = [video_of(state, settings.result_ttl_s) for state in states]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return VideoList(data=data, first_id=first, last_id=last, has_more=more)


@router.get("/{video_id}/content")
async def download_video(
    video_id: str, settings: SettingsDep, store: StoreDep, owner: OwnerDep, variant: str = "video"
) -> Response:
    """The MP4 of a completed job, or (``variant=thumbnail``) its first frame."""
    kind = VARIANTS.get(variant)
    if kind is None:
        accepted = ", ".join(VARIANTS)
        raise bad_param("variant", f"Unsupported value for 'variant': {variant!r}; this server serves {accepted}.")
    await _job(video_id, store, owner)
    return await serve_result(video_id, 0, kind, store, settings, owner)


@router.delete("/{video_id}")
async def delete_video(video_id: str, store: StoreDep, owner: OwnerDep) -> VideoDeleted:
    """Delete a finished job; abort an unfinished one (``deleted: false``)."""
    await _job(video_id, store, owner)
    outcome = await store.forget(video_id)
    if outcome is None:
        raise video_not_found(video_id)
    if isinstance(outcome, Forgotten):
        await store.drop_video(video_id, owner)
        return VideoDeleted(id=video_id, deleted=True)
    await store.abort(video_id, time.time())
    return VideoDeleted(id=video_id, deleted=False)
