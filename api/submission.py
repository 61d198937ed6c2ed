"""Accepting requests: the one path every API surface (native, OpenAI) submits through.

``accept`` checks each request against the fleet's limits, decodes and normalises its input images (off the event
loop), resolves its id (of its model's shard, or of one of its model's shards: ``Shards.new_request_id_of``) and
seed, and queues all of them in one atomic step (per shard in a sharded fleet: ``api.shard_router``). It raises
what the caller's error handlers turn into answers: ``RequestValidationError`` (422, every problem of every
request, each naming its field)
or an ``HTTPException`` 503 with Retry-After when the queue is full; past the input budget (``api.input_budget``), 413
or 429 with Retry-After, naming the field. With an API key (``api.auth``), the requests are
recorded under its name and its limits apply (``api.key_limits``: 429 with Retry-After). A request's webhook must be
allowed by the server (``api.webhook_urls``: 422 naming ``webhook``); it is stored with the request, outside its spec
(so it plays no part in batching). With an ``Idempotency-Key`` (``api.idempotency``) a submission is queued once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from anyio import to_thread
from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError

from api import idempotency
from api.auth import KeyRefused
from api.capabilities import capability_errors, video_models
from api.input_budget import budget_full, too_large
from api.input_images import StoredInputs, prepare_inputs
from api.key_limits import batch_errors, max_queued_reached, take_tokens
from api.limits import ErrorDict, Loc, limit_errors, request_model
from api.outage import retry_after_headers
from api.shard_router import Store
from api.store import RefusalReason, Submitter, Webhook
from api.webhook_urls import webhook_errors
from shared.api_keys import ApiKey
from shared.contracts import DEFAULT_STRENGTH, MAX_SEED, RequestSpec
from shared.settings import Settings
from shared.webhooks import subscription
from shared.wire import GenerateRequest


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


def _count_refused(store: Store, reason: RefusalReason) -> None:
    if store.counters is not None:
        store.counters.count_refused(reason)


@dataclass(frozen=True, slots=True)
class Submission:
    """What ``accept`` queued: the requests' specs, in order; ``replayed`` when an earlier call with the same
    Idempotency-Key had queued them (nothing was queued now)."""

    specs: list[RequestSpec]
    replayed: bool = False
    claim: idempotency.Claim | None = None  # the key this call queued them under: ``release`` if they are undone

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers that say so (``Idempotent-Replayed``)."""
        return {idempotency.REPLAYED_HEADER: "true"} if self.replayed else {}


async def accept(
    requests: Sequence[GenerateRequest],
    settings: Settings,
    store: Store,
    locs: Sequence[Loc],
    caller: ApiKey | None = None,
    idempotency_key: str | None = None,
) -> Submission:
    """Queue ``requests`` (all or none) for ``caller`` (None: the api has no keys) and return their specs, in
    order; ``locs[i]`` prefixes request i's errors (a batch's own errors are at ``locs[0]`` minus its index). With
    ``idempotency_key`` (``api.idempotency``), a submission that key queued before is answered instead."""
    errors = batch_errors(len(requests), caller, locs[0][:-1])
    for request, loc in zip(requests, locs, strict=True):
        errors += limit_errors(request, settings, loc)
    errors += await webhook_errors(requests, settings, locs)
    if errors:
        _count_refused(store, "invalid")
        raise RequestValidationError(errors)
    models = [request_model(request, settings) for request in requests]
    ids = [store.new_request_id(model) for model in models]
    claim: idempotency.Claim | None = None
    if idempotency_key is not None:  # before what the fleet's state decides: a replay answers whatever it is now
        ttl_s = min(settings.idempotency_ttl_s, settings.result_ttl_s)
        owner = caller.name if caller is not None else None
        claimed = await idempotency.begin(store, idempotency_key, owner, requests, ids, ttl_s)
        if isinstance(claimed, idempotency.Replayed):
            return Submission(claimed.specs, replayed=True)
        claim = claimed
    try:
        specs, inputs = await _prepared(requests, settings, store, locs, models, ids)
        await _take_tokens(store, caller, len(specs))
    except BaseException:  # nothing was queued: the key may be used again at once
        if claim is not None:
            await asyncio.shield(claim.release())
        raise
    try:
        await _queue(specs, inputs, requests, settings, store, locs, caller)
    except HTTPException:  # refused: nothing was queued
        if claim is not None:
            await asyncio.shield(claim.release())
        raise
    # any other failure (Redis did not answer, the call was cancelled) may have queued them: the claim stays
    # pending, and the first call with the key after idempotency.PENDING_S finds out
    if claim is not None:
        await asyncio.shield(claim.done())
    return Submission(specs, claim=claim)


async def _prepared(
    requests: Sequence[GenerateRequest],
    settings: Settings,
    store: Store,
    locs: Sequence[Loc],
    models: Sequence[str],
    ids: Sequence[str],
) -> tuple[list[RequestSpec], list[StoredInputs | None]]:
    """The requests' specs (as ``ids``, of ``models``) and stored inputs, once the fleet can run them (422 naming
    what it cannot) and their input images are read (422, 413)."""
    fleet = await store.fleet_capabilities()
    errors = capability_errors(requests, fleet, locs, settings)
    if errors:
        _count_refused(store, "invalid")
        raise RequestValidationError(errors)
    inputs: list[StoredInputs | None] = [None] * len(requests)
    if any(request.image is not None for request in requests):
        inputs, errors = await to_thread.run_sync(_inputs_of, requests, settings, locs)
        if errors:
            _count_refused(store, "invalid")
            raise RequestValidationError(errors)
        oversized = too_large(inputs, locs, settings.max_queued_input_bytes)
        if oversized is not None:
            _count_refused(store, "input_budget")
            raise oversized
    now = time.time()
    videos = video_models(fleet)
    specs = [
        request.to_spec(
            request_id=request_id,
            model=model,
            seed=request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1),
            created_at=now,
            default_priority=settings.default_priority,
            default_strength=None if model in videos else DEFAULT_STRENGTH,
        )
        for request, model, request_id in zip(requests, models, ids, strict=True)
    ]
    return specs, inputs


async def _take_tokens(store: Store, caller: ApiKey | None, cost: int) -> None:
    try:
        await take_tokens(store, caller, cost)
    except KeyRefused:
        _count_refused(store, "rate_limited")
        raise


async def _queue(
    specs: list[RequestSpec],
    inputs: Sequence[StoredInputs | None],
    requests: Sequence[GenerateRequest],
    settings: Settings,
    store: Store,
    locs: Sequence[Loc],
    caller: ApiKey | None,
) -> None:
    """Queue ``specs`` in one atomic step; raise the refusal's answer."""
    submitter = Submitter(caller.name, caller.max_queued, caller.share) if caller is not None else None
    webhooks = [
        Webhook(request.webhook, subscription(request.webhook_events)) if request.webhook else None
        for request in requests
    ]
    outcome = await store.submit(specs, inputs, submitter, webhooks)
    if outcome == "max_queued" and caller is not None:
        _count_refused(store, "max_queued")
        raise max_queued_reached(caller)
    if outcome == "input_budget":
        _count_refused(store, "input_budget")
        raise budget_full(inputs, locs, settings.max_queued_input_bytes)
    if outcome != "accepted":
        _count_refused(store, "queue_full")
        raise HTTPException(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="the request queue is full; retry later",
            headers=retry_after_headers(),
        )
    if store.counters is not None:
        store.counters.count_submitted(len(specs))
