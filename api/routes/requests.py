"""Submitting, reading, aborting requests and downloading their images."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from fastapi.exceptions import RequestValidationError

from api.deps import SettingsDep, StoreDep, WaiterDep
from api.limits import ErrorDict, limit_errors
from api.schemas import (
    AbortResult,
    Accepted,
    BatchAccepted,
    BatchRequest,
    GenerateRequest,
    RequestView,
)
from api.store import RequestStore
from shared.contracts import MAX_SEED, RequestSpec, RequestStatus
from shared.settings import Settings

router = APIRouter(prefix="/v1/requests", tags=["requests"])

RETRY_AFTER_S = 5
MAX_WAIT_S = 60.0
Responses = dict[int | str, dict[str, Any]]
_QUEUE_FULL: Responses = {503: {"description": "The queue is full; retry after Retry-After seconds."}}
_NOT_FOUND: Responses = {404: {"description": "Unknown request id (never submitted, or expired)."}}


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
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def _unknown(request_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no request {request_id!r} (unknown or expired)")


@router.post("", status_code=status.HTTP_202_ACCEPTED, responses=_QUEUE_FULL)
async def submit_request(body: GenerateRequest, settings: SettingsDep, store: StoreDep) -> Accepted:
    """Queue one request; its id is polled with ``GET /v1/requests/{id}``."""
    errors = limit_errors(body, settings)
    if errors:
        raise RequestValidationError(errors)
    specs = _specs([body], settings)
    await _submit(store, specs)
    return Accepted(id=specs[0].id)


@router.post("/batch", status_code=status.HTTP_202_ACCEPTED, responses=_QUEUE_FULL)
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


@router.get("/{request_id}", responses=_NOT_FOUND)
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
    whichever comes first (no busy polling needed).
    """
    if wait_s <= 0:
        state = await store.get(request_id)
    else:
        finished = waiter.register(request_id)  # before reading: a finish in between still wakes us
        try:
            state = await store.get(request_id)
            if state is not None and not state.status.terminal:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished, timeout=wait_s)
                state = await store.get(request_id)
        finally:
            waiter.discard(request_id, finished)
    if state is None:
        raise _unknown(request_id)
    return RequestView.from_state(state)


@router.get(
    "/{request_id}/images/{index}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}, 404: {"description": "The image does not exist (yet)."}},
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
    responses={**_NOT_FOUND, 409: {"description": "The request already finished (succeeded or failed)."}},
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
