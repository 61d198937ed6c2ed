"""Submitting, reading, aborting requests and downloading their images."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import Sequence

from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from fastapi.exceptions import RequestValidationError

from api.deps import SettingsDep, StoreDep, WaiterDep
from api.limits import ErrorDict, limit_errors
from api.outage import retry_after_headers
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
from api.store import RequestStore
from shared.contracts import MAX_SEED, RequestSpec, RequestStatus
from shared.settings import Settings

router = APIRouter(prefix="/v1/requests", tags=["requests"])

MAX_WAIT_S = 60.0


def _specs(requests: Sequence[GenerateRequest], settings: Settings) -> list[RequestSpec]:
    model = settings.model or "demo"
    now = time.time()
    return [
        req.to_spec(
            request_id=uuid.uuid4().hex,
            model=model,
            seed=req.seed if req.seed is not None else secrets.randbelow(MAX_SEED + 1),
            created_at=now,
        )
        for req in requests
    ]


async def _submit(store: RequestStore, specs: list[RequestSpec]) -> None:
    if not await store.submit(specs):
        raise HTTPException(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="the request queue is full; retry later",
            headers=retry_after_headers(),
        )


def _unknown(request_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no request {request_id!r} (unknown or expired)")


@router.post("", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **QUEUE_FULL_OR_UNAVAILABLE})
async def submit_request(body: GenerateRequest, settings: SettingsDep, store: StoreDep) -> Accepted:
    """Queue one request; its id is polled with ``GET /v1/requests/{id}``."""
    errors = limit_errors(body, settings)
    if errors:
        raise RequestValidationError(errors)
    specs = _specs([body], settings)
    await _submit(store, specs)
    return Accepted(id=specs[0].id)


@router.post("/batch", status_code=status.HTTP_202_ACCEPTED, responses={**BAD_BODY, **QUEUE_FULL_OR_UNAVAILABLE})
async def submit_batch(body: BatchRequest, settings: SettingsDep, store: StoreDep) -> BatchAccepted:
    """Queue several independent requests at once (all or none); ids in submission order."""
    errors: list[ErrorDict] = []
    for i, req in enumerate(body.requests):
        errors += limit_errors(req, settings, ("body", "requests", i))
    if errors:
        raise RequestValidationError(errors)
    specs = _specs(body.requests, settings)
    await _submit(store, specs)
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
