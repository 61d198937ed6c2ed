"""Accepting requests: the one path every API surface (native, OpenAI) submits through.

``accept`` checks each request against the fleet's limits, decodes and normalises its input images (off the event
loop), resolves its id and seed, and queues all of them in one atomic step. It raises what the caller's error
handlers turn into answers: ``RequestValidationError`` (422, every problem of every request, each naming its field)
or an ``HTTPException`` 503 with Retry-After when the queue is full.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence

from anyio import to_thread
from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError

from api.capabilities import capability_errors
from api.input_images import StoredInputs, prepare_inputs
from api.limits import ErrorDict, Loc, limit_errors
from api.outage import retry_after_headers
from api.schemas import GenerateRequest
from api.store import RefusalReason, RequestStore
from shared.contracts import MAX_SEED, RequestSpec
from shared.settings import Settings


def _inputs_of(
    requests: Sequence[GenerateRequest], settings: Settings, locs: Sequence[Loc]
) -> tuple[list[StoredInputs | None], list[ErrorDict]]:
    inputs: list[StoredInputs | None] = []
    errors: list[ErrorDict] = []
    for request, loc in zip(requests, locs, strict=True):
        stored, problems = prepare_inputs(request, settings, loc)
        inputs.append(stored)
        errors += problems
    return inputs, errors


def _count_refused(store: RequestStore, reason: RefusalReason) -> None:
    if store.counters is not None:
        store.counters.count_refused(reason)


async def accept(
    requests: Sequence[GenerateRequest], settings: Settings, store: RequestStore, locs: Sequence[Loc]
) -> list[RequestSpec]:
    """Queue ``requests`` (all or none) and return their specs, in order; ``locs[i]`` prefixes request i's errors."""
    errors: list[ErrorDict] = []
    for request, loc in zip(requests, locs, strict=True):
        errors += limit_errors(request, settings, loc)
    if not errors:
        errors = capability_errors(requests, await store.fleet_capabilities(), locs)
    if errors:
        _count_refused(store, "invalid")
        raise RequestValidationError(errors)
    inputs: list[StoredInputs | None] = [None] * len(requests)
    if any(request.image is not None for request in requests):
        inputs, errors = await to_thread.run_sync(_inputs_of, requests, settings, locs)
        if errors:
            _count_refused(store, "invalid")
            raise RequestValidationError(errors)
    model = settings.model_id
    now = time.time()
    specs = [
        request.to_spec(
            request_id=uuid.uuid4().hex,
            model=model,
            seed=request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1),
            created_at=now,
        )
        for request in requests
    ]
    if not await store.submit(specs, inputs):
        _count_refused(store, "queue_full")
        raise HTTPException(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="the request queue is full; retry later",
            headers=retry_after_headers(),
        )
    if store.counters is not None:
        store.counters.count_submitted(len(specs))
    return specs
