"""Submitting, reading, aborting requests and downloading their images."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from api.deps import SettingsDep, StoreDep, WaiterDep
from api.responses import BAD_BODY, NOT_FOUND, QUEUE_FULL_OR_UNAVAILABLE, UNAVAILABLE
from api.schemas import (
    AbortResult,
    Accepted,
    BatchAccepted,
    BatchRequest,
    ErrorMessage,
    GenerateRequest,
    RequestView,
)
from api.submission import accept
from shared.contracts import RequestStatus

router = APIRouter(prefix="/v1/requests", tags=["requests"])

MAX_WAIT_S = 60.0


def _unknown(request_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no request {request_id!r} (unknown or expired)")


@router.post("", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **QUEUE_FULL_OR_UNAVAILABLE})
async def submit_request(body: GenerateRequest, settings: SettingsDep, store: StoreDep) -> Accepted:
    """Queue one request; its id is polled with ``GET /v1/requests/{id}``."""
    (spec,) = await accept([body], settings, store, [("body",)])
    return Accepted(id=spec.id)


@router.post("/batch", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **QUEUE_FULL_OR_UNAVAILABLE})
async def submit_batch(body: BatchRequest, settings: SettingsDep, store: StoreDep) -> BatchAccepted:
    """Queue several independent requests at once (all or none); ids in submission order."""
    locs = [("body", "requests", i) for i in range(len(body.requests))]
    specs = await accept(body.requests, settings, store, locs)
    return BatchAccepted(ids=[spec.id for spec in specs])


@router.get("/{request_id}", responses={**NOT_FOUND, **UNAVAILABLE})
async def get_request(
    request_id: str,
    store: StoreDep,
    waiter: WaiterDep,
    wait_s: float = Query(
        0.0, ge=0.0, le=MAX_WAIT_S, description="Long poll: answer as soon as the request finishes, at most this late."
    ),
) -> RequestView:
    """State, progress, parameters and (once succeeded) image URLs of a request.

    With ``wait_s`` the answer is held until the request reaches a terminal status or ``wait_s`` passes,
    whichever comes first (no busy polling needed). The wait counts from the call, the first read included, and
    each read is bounded by the store: the answer (503 when Redis fails) comes within ``wait_s`` +
    ``redis_socket_timeout_s`` even when the completion channel is down.
    """
    if wait_s <= 0:
        state = await store.get(request_id)
    else:
        wait_until = asyncio.get_running_loop().time() + wait_s
        finished = waiter.register(request_id)  # before reading: a finish in between still wakes us
        try:
            state = await store.get(request_id)
            left_s = wait_until - asyncio.get_running_loop().time()
            if state is not None and not state.status.terminal and left_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished, timeout=left_s)
                state = await store.get(request_id)
        finally:
            waiter.discard(request_id, finished)
    if state is None:
        raise _unknown(request_id)
    return RequestView.from_state(state)


@router.get(
    "/{request_id}/images/{index}",
    response_class=Response,
    responses={
        200: {"content": {"image/png": {}}, "description": "The PNG."},
        404: {"model": ErrorMessage, "description": "The image does not exist (yet)."},
        **UNAVAILABLE,
    },
)
async def get_image(request_id: str, store: StoreDep, index: int = Path(ge=0)) -> Response:
    """PNG bytes of image ``index`` of a succeeded request."""
    data = await store.image(request_id, index)
    if data is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"image {index} of request {request_id!r} does not exist (not done, unknown or expired)",
        )
    return Response(content=data, media_type="image/png")


@router.post(
    "/{request_id}/abort",
    responses={
        **NOT_FOUND,
        409: {"model": ErrorMessage, "description": "The request already finished (succeeded or failed)."},
        **UNAVAILABLE,
    },
)
async def abort_request(request_id: str, store: StoreDep) -> AbortResult:
    """Abort a request (idempotent). Queued or scheduled: ``aborted`` at once; running: its worker stops it.

    409 when it already succeeded or failed.
    """
    result = await store.abort(request_id, time.time())
    if result is None:
        raise _unknown(request_id)
    if result in (RequestStatus.SUCCEEDED, RequestStatus.FAILED):
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"request {request_id!r} already finished as {result.value}"
        )
    return AbortResult(id=request_id, status=result)
