"""One OpenAI Images call = one ordinary fleet request, submitted, awaited and answered.

The request goes through the native submission path (``api.submission.accept``: limits, input images, id, seed,
the atomic ``SUBMIT``), so it is batched with every other request and visible under ``/v1/requests/{id}``; its id
is in the ``x-request-id`` header of every answer once it exists. The call then waits for it to end:

- woken by the app's ``CompletionWaiter`` (registered before each read of the state, so no finish is missed), and
  re-reading the state every ``RECHECK_S`` anyway (a wake-up lost while the completion channel reconnects; a Redis
  that fails meanwhile is waited out, not reported);
- at most ``wait_limit_s`` (the fleet's ``batch_time_limit_s``): then the request is aborted and the answer is 504;
- a client that disconnects (or a call cancelled) aborts its request, through the native abort (``store.abort``).

A request that ended gives (``x-should-retry: false`` on each error: the fleet has already retried what it retries,
and a client library retrying would only queue the same work again):

- succeeded: 200 ``{"created", "data": [{"b64_json"} | {"url"}, ...], "output_format"}``, one entry per image, in
  order, each encoded in the request's ``output_format`` (``png``, ``jpeg`` or ``webp``);
- failed because of its own input (``InvalidInput``, ``InvalidRequest``, ``UnsupportedTask``): 400
  ``invalid_request_error`` / ``invalid_input``;
- failed otherwise (the model raised, out of memory alone, worker lost, time limit): 500 ``server_error`` /
  ``generation_failed``, the message naming the error type and message, as OpenAI does;
- aborted by someone else (``POST /v1/requests/{id}/abort``): 409 ``invalid_request_error`` / ``request_aborted``;
- out of its own ``timeout_s`` (error ``Timeout``: failed before it started, or aborted while running): 504
  ``server_error`` / ``timeout``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Request, status
from fastapi.responses import JSONResponse
from starlette.types import Receive

from api import idempotency
from api.openai.errors import INVALID_REQUEST, SERVER_ERROR, OpenAIError
from api.openai.schemas import ImageObject, ImagesResponse, ResponseFormat
from api.outage import StoreUnavailable
from api.shard_router import Store, Waiter
from api.submission import accept
from shared.api_keys import ApiKey
from shared.contracts import TIMEOUT_ERROR, RequestState, RequestStatus
from shared.settings import Settings
from shared.wire import GenerateRequest

log = logging.getLogger(__name__)

RECHECK_S = 2.0
"""Longest wait between two reads of the state while no wake-up comes."""
CLIENT_CLOSED_REQUEST = 499
"""The (nginx) status of the answer to a client that is gone; nobody reads it."""
REQUEST_ID_HEADER = "x-request-id"
CLIENT_FAULTS = frozenset({"InvalidInput", "InvalidRequest", "UnsupportedTask"})
"""Error types of a request that failed because of what it asked for: 400, not 500."""
IMAGE_ROUTE = "get_image"
"""Name of the native route that serves image k of a request (``/v1/requests/{id}/images/{k}``)."""

_aborts: set[asyncio.Task[object]] = set()


def wait_limit_s(settings: Settings) -> float:
    """How long a call waits for its request before aborting it and answering 504."""
    return float(settings.batch_time_limit_s)


class ClientGone(Exception):
    """The client disconnected while its call waited."""


class WaitExpired(Exception):
    """The request did not end within the wait limit."""


@dataclass(frozen=True)
class OpenAICall:
    """What answering one call takes beside its body; FastAPI builds it per call (``api.openai.images``)."""

    request: Request
    settings: Settings
    store: Store
    waiter: Waiter
    caller: ApiKey | None = None


async def respond(native: GenerateRequest, answer_format: ResponseFormat, call: OpenAICall) -> JSONResponse:
    """Submit ``native`` as one fleet request of ``call.caller`` (``api.auth``), wait for its end and answer it in
    OpenAI's shape."""
    request, settings, store, waiter = call.request, call.settings, call.store, call.waiter
    key = idempotency.parse_key(request.headers.get(idempotency.HEADER))
    submission = await accept([native], settings, store, [("body",)], call.caller, key)
    (spec,) = submission.specs
    request_id = spec.id
    headers = {REQUEST_ID_HEADER: request_id, **submission.headers}
    keyed = key is not None  # its request runs on when this call ends early: a retry with the key waits for it
    try:
        state = await _ended(request_id, request.receive, store, waiter, wait_limit_s(settings))
    except ClientGone:
        if not keyed:
            await _abort(store, request_id, "client disconnected")
        return JSONResponse(None, status_code=CLIENT_CLOSED_REQUEST, headers=headers)
    except WaitExpired:
        if not keyed:
            await _abort(store, request_id, "wait limit reached")
        fate = f"it runs on: send the call again with its {idempotency.HEADER} to wait" if keyed else "it was aborted"
        raise OpenAIError(
            status.HTTP_504_GATEWAY_TIMEOUT,
            f"request {request_id} did not finish within {wait_limit_s(settings):.0f} s (this server's "
            f"batch_time_limit_s); {fate}",
            kind=SERVER_ERROR,
            code="timeout",
            headers={**headers, "x-should-retry": "true" if keyed else "false"},
        ) from None
    except asyncio.CancelledError:
        if not keyed:
            await _abort(store, request_id, "call cancelled")
        raise
    if state.status is RequestStatus.SUCCEEDED:
        data = await _images(state, answer_format, request, store)
        created = int(state.finished_at or time.time())
        answer = ImagesResponse(created=created, data=data, output_format=state.spec.output_format)
        body = answer.model_dump(mode="json", exclude_none=True)
        return JSONResponse(body, headers=headers)
    raise _outcome_error(state, headers)


async def _ended(request_id: str, receive: Receive, store: Store, waiter: Waiter, limit_s: float) -> RequestState:
    """The state of ``request_id`` once terminal; ``WaitExpired`` after ``limit_s``, ``ClientGone`` as soon as
    the client disconnects."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    gone = asyncio.ensure_future(_disconnect(receive))
    try:
        while True:
            finished = waiter.register(request_id)  # before reading: a finish in between still wakes us
            try:
                state = await _read(store, request_id)
                if state is not None and state.status.terminal:
                    return state
                left_s = deadline - loop.time()
                if left_s <= 0:
                    raise WaitExpired
                either: set[asyncio.Future[object]] = {finished, gone}  # type: ignore[arg-type]
                await asyncio.wait(either, timeout=min(left_s, RECHECK_S), return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    raise ClientGone
            finally:
                waiter.discard(request_id, finished)
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone


async def _read(store: Store, request_id: str) -> RequestState | None:
    """The state, or None while Redis fails (the wait goes on; the deadline still holds)."""
    try:
        state = await store.get(request_id)
    except StoreUnavailable as exc:
        log.warning("reading request %s while waiting for it: %s", request_id, exc)
        return None
    if state is None:
        raise _lost(request_id, f"request {request_id} is gone from the store (expired or deleted)")
    return state


def _lost(request_id: str, message: str) -> OpenAIError:
    """The answer when what the call waited for vanished from the store."""
    return OpenAIError(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        message,
        kind=SERVER_ERROR,
        code="request_lost",
        headers={REQUEST_ID_HEADER: request_id},
    )


async def _disconnect(receive: Receive) -> None:
    """Return when the client disconnects. The body was read already: the server's next message is the
    disconnect (uvicorn sends it at once when the client goes, or when the answer is complete)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _abort(store: Store, request_id: str, why: str) -> None:
    """The native abort, run to its end even when the calling task is being cancelled."""

    async def abort() -> object:
        try:
            return await store.abort(request_id, time.time())
        except StoreUnavailable as exc:  # it ran or not; the reaper and the TTLs bound what is left
            log.warning("aborting request %s (%s) failed: %s", request_id, why, exc)
            return None

    task: asyncio.Task[object] = asyncio.ensure_future(abort())
    _aborts.add(task)
    task.add_done_callback(_aborts.discard)
    log.info("aborting request %s: %s", request_id, why)
    await asyncio.shield(task)


async def _images(
    state: RequestState, answer_format: ResponseFormat, request: Request, store: Store
) -> list[ImageObject]:
    request_id = state.spec.id
    if answer_format == "url":
        return [
            ImageObject(url=str(request.url_for(IMAGE_ROUTE, request_id=request_id, index=str(k))))
            for k in range(state.image_count)
        ]
    images: list[ImageObject] = []
    for k, key in enumerate(state.image_keys):
        data = await store.result(key)
        if data is None or state.results_evicted_at is not None:
            raise _lost(request_id, f"image {k} of request {request_id} is gone from the result store")
        images.append(ImageObject(b64_json=base64.b64encode(data).decode()))
    return images


def _outcome_error(state: RequestState, headers: Mapping[str, str]) -> OpenAIError:
    """The answer to a request that ended without images (failed or aborted)."""
    request_id = state.spec.id
    final = {**headers, "x-should-retry": "false"}
    if state.error is not None and state.error.type == TIMEOUT_ERROR:
        return OpenAIError(
            status.HTTP_504_GATEWAY_TIMEOUT,
            f"request {request_id} ran out of its timeout_s ({state.spec.timeout_s} s): {state.error.message}",
            kind=SERVER_ERROR,
            code="timeout",
            headers=final,
        )
    if state.status is RequestStatus.ABORTED:
        return OpenAIError(
            status.HTTP_409_CONFLICT,
            f"request {request_id} was aborted (POST /v1/requests/{request_id}/abort) before it finished",
            code="request_aborted",
            headers=final,
        )
    error_type = state.error.type if state.error else "Error"
    message = f"{error_type}: {state.error.message if state.error else 'no reason recorded'}"
    if error_type in CLIENT_FAULTS:
        return OpenAIError(
            status.HTTP_400_BAD_REQUEST, message, kind=INVALID_REQUEST, code="invalid_input", headers=final
        )
    return OpenAIError(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        f"image generation failed: {message}",
        kind=SERVER_ERROR,
        code="generation_failed",
        headers=final,
    )
