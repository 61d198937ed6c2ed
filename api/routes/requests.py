"""Submitting, reading, aborting and deleting requests, and downloading their images.

With API keys (``api.auth``) a request is its submitter's: every other key gets the 404 of an unknown id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from fastapi.responses import RedirectResponse

from api.auth import CallerDep, OwnerDep
from api.deps import SettingsDep, StoreDep, WaiterDep
from api.idempotency import IdempotencyKeyDep
from api.key_limits import KEY_LIMITED
from api.request_ids import RequestIdDep, unknown_requests
from api.responses import BAD_BODY, NOT_FOUND, QUEUE_FULL_OR_UNAVAILABLE, UNAVAILABLE, Responses
from api.shard_router import Store, Waiter
from api.store import Forgotten
from api.submission import Submission, accept
from shared.api_keys import ApiKey
from shared.contracts import RequestStatus
from shared.results import media_type_of
from shared.settings import Settings
from shared.wire import (
    AbortResult,
    Accepted,
    BatchAccepted,
    BatchRequest,
    ErrorMessage,
    GenerateRequest,
    RequestView,
)

router = APIRouter(prefix="/v1/requests", tags=["requests"])

MAX_WAIT_S = 60.0


def _unknown(request_id: str) -> HTTPException:
    return unknown_requests([request_id])


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **KEY_LIMITED, **QUEUE_FULL_OR_UNAVAILABLE}
)
async def submit_request(
    body: GenerateRequest,
    settings: SettingsDep,
    store: StoreDep,
    waiter: WaiterDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKeyDep,
    response: Response,
) -> Accepted:
    """Queue one request; its id is polled with ``GET /v1/requests/{id}``."""
    epoch = waiter.epoch  # before submitting: see CompletionWaiter.accepted
    submission = await accept([body], settings, store, [("body",)], caller, idempotency_key)
    (request_id,) = _accepted(submission, epoch, waiter, caller, response)
    return Accepted(id=request_id)


@router.post(
    "/batch", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **KEY_LIMITED, **QUEUE_FULL_OR_UNAVAILABLE}
)
async def submit_batch(
    body: BatchRequest,
    settings: SettingsDep,
    store: StoreDep,
    waiter: WaiterDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKeyDep,
    response: Response,
) -> BatchAccepted:
    """Queue several independent requests at once (all or none); ids in submission order."""
    locs = [("body", "requests", i) for i in range(len(body.requests))]
    epoch = waiter.epoch  # before submitting: see CompletionWaiter.accepted
    submission = await accept(body.requests, settings, store, locs, caller, idempotency_key)
    return BatchAccepted(ids=_accepted(submission, epoch, waiter, caller, response))


def _accepted(
    submission: Submission, epoch: int | None, waiter: Waiter, caller: ApiKey | None, response: Response
) -> list[str]:
    """The ids a submission queued; their completions noted (``CompletionWaiter.accepted``: a replayed one may have
    ended unseen by this process, so it is not) and the answer's headers set."""
    response.headers.update(submission.headers)
    ids = [spec.id for spec in submission.specs]
    if not submission.replayed:
        waiter.accepted(ids, epoch, caller.name if caller is not None else None)
    return ids


@router.get("/{request_id}", responses={**NOT_FOUND, **UNAVAILABLE})
async def get_request(
    request_id: RequestIdDep,
    store: StoreDep,
    waiter: WaiterDep,
    owner: OwnerDep,
    wait_s: float = Query(
        0.0, ge=0.0, le=MAX_WAIT_S, description="Long poll: answer as soon as the request finishes, at most this late."
    ),
) -> RequestView:
    """State, progress, parameters and (once succeeded) image URLs of a request.

    With ``wait_s`` the answer is held until the request reaches a terminal status or ``wait_s`` passes,
    whichever comes first (no busy polling needed). The wait counts from the call, the first read included, and
    each read is bounded by the store: the answer (503 when Redis fails) comes within ``wait_s`` +
    ``redis_socket_timeout_s`` even when the completion channel is down. A request this api process accepted
    while subscribed to the completion channel, whose ending has not come, is not read before the wait (it has
    not finished: ``CompletionWaiter.unfinished_here``).
    """
    if wait_s <= 0:
        state = await store.get(request_id, owner)
    else:
        wait_until = asyncio.get_running_loop().time() + wait_s
        finished = waiter.register(request_id)  # before reading: a finish in between still wakes us
        try:
            skipped = waiter.unfinished_here(request_id, owner)
            state = None if skipped else await store.get(request_id, owner)
            while skipped or (state is not None and not state.status.terminal):
                left_s = wait_until - asyncio.get_running_loop().time()
                ended = True  # the ending came or the time is up: read once more and answer
                if left_s > 0:
                    with contextlib.suppress(TimeoutError):
                        ended = await asyncio.wait_for(finished, timeout=left_s)
                waiter.discard(request_id, finished)  # False: the note lapsed (subscription lost): read, wait on
                finished = waiter.register(request_id)
                state, skipped = await store.get(request_id, owner), False
                if ended:
                    break
        finally:
            waiter.discard(request_id, finished)
    if state is None:
        raise _unknown(request_id)
    return RequestView.from_state(state)


def _result_responses(kind: str, content: dict[str, Any]) -> Responses:
    return {
        200: {"content": content, "description": f"The {kind}."},
        307: {"description": f"Redirect to a presigned URL of the {kind} (result_delivery=redirect, S3 store)."},
        404: {"model": ErrorMessage, "description": f"The {kind} does not exist (yet): not done, unknown or expired."},
        410: {"model": ErrorMessage, "description": f"The {kind} was stored, and is gone (the detail says why)."},
        **UNAVAILABLE,
    }


async def serve_result(
    request_id: str, index: int, kind: str, store: Store, settings: Settings, owner: str | None
) -> Response:
    """Output ``index`` of a succeeded request (``kind``: image or video) of ``owner``, from the result store: its
    bytes, or a redirect to a presigned URL (``result_delivery=redirect`` where the store has them)."""
    state = await store.get(request_id, owner)
    keys = (state.image_keys if kind == "image" else state.video_keys) if state is not None else ()
    if state is None or state.status is not RequestStatus.SUCCEEDED or index >= len(keys):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"{kind} {index} of request {request_id!r} does not exist (not done, unknown or expired)",
        )
    if state.results_evicted_at is not None:
        raise HTTPException(
            status.HTTP_410_GONE,
            detail=f"the outputs of request {request_id!r} were dropped by the Redis result store's size cap "
            f"(result_redis_max_bytes={settings.result_redis_max_bytes}); the fleet keeps the newest results only",
        )
    key = keys[index]
    if settings.result_delivery == "redirect":
        url = await store.result_url(key)
        if url is not None:
            return RedirectResponse(url, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    data = await store.result(key)
    if data is None:
        raise HTTPException(
            status.HTTP_410_GONE, detail=f"{kind} {index} of request {request_id!r} is gone from the result store"
        )
    return Response(content=data, media_type=media_type_of(key))


@router.get(
    "/{request_id}/images/{index}",
    response_class=Response,
    responses=_result_responses("image", {"image/png": {}, "image/jpeg": {}, "image/webp": {}}),
)
async def get_image(
    request_id: RequestIdDep, store: StoreDep, settings: SettingsDep, owner: OwnerDep, index: int = Path(ge=0)
) -> Response:
    """Image ``index`` of a succeeded request, in its ``output_format`` (a video request's frames, video by video):
    its bytes, or a redirect to a presigned URL (``result_delivery=redirect`` where the store has them)."""
    return await serve_result(request_id, index, "image", store, settings, owner)


@router.get(
    "/{request_id}/videos/{index}",
    response_class=Response,
    responses=_result_responses("video", {"video/mp4": {}}),
)
async def get_video(
    request_id: RequestIdDep, store: StoreDep, settings: SettingsDep, owner: OwnerDep, index: int = Path(ge=0)
) -> Response:
    """Video ``index`` (MP4) of a succeeded video request, or a redirect to a presigned URL."""
    return await serve_result(request_id, index, "video", store, settings, owner)


@router.get("/{request_id}/video", response_class=Response, responses=_result_responses("video", {"video/mp4": {}}))
async def get_first_video(
    request_id: RequestIdDep, store: StoreDep, settings: SettingsDep, owner: OwnerDep
) -> Response:
    """The (first) video of a succeeded video request: ``/videos/0``."""
    return await serve_result(request_id, 0, "video", store, settings, owner)


@router.delete(
    "/{request_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={
        **NOT_FOUND,
        409: {"model": ErrorMessage, "description": "The request has not finished: abort it first."},
        **UNAVAILABLE,
    },
)
async def delete_request(request_id: RequestIdDep, store: StoreDep, owner: OwnerDep) -> Response:
    """Delete a finished request: its state and its images, from whichever result store holds them.

    409 while it is queued, scheduled or running (``POST /v1/requests/{id}/abort`` first).
    """
    if not await store.owns(request_id, owner):
        raise _unknown(request_id)
    outcome = await store.forget(request_id)
    if outcome is None:
        raise _unknown(request_id)
    if not isinstance(outcome, Forgotten):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"request {request_id!r} is {outcome.value}: abort it first (POST /v1/requests/{request_id}/abort),"
            " then delete it once it is aborted",
        )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{request_id}/abort",
    responses={
        **NOT_FOUND,
        409: {"model": ErrorMessage, "description": "The request already finished (succeeded or failed)."},
        **UNAVAILABLE,
    },
)
async def abort_request(request_id: RequestIdDep, store: StoreDep, owner: OwnerDep) -> AbortResult:
    """Abort a request (idempotent). Queued or scheduled: ``aborted`` at once; running: its worker stops it.

    409 when it already succeeded or failed.
    """
    if not await store.owns(request_id, owner):
        raise _unknown(request_id)
    result = await store.abort(request_id, time.time())
    if result is None:
        raise _unknown(request_id)
    if result in (RequestStatus.SUCCEEDED, RequestStatus.FAILED):
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"request {request_id!r} already finished as {result.value}"
        )
    return AbortResult(id=request_id, status=result)
