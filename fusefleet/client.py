"""A Python client of the fusefleet HTTP api: ``Client`` (sync) and ``AsyncClient`` (asyncio), both on httpx, with
the same methods; how to use them is the README's *Python client and CLI*, the api's answers docs/api.md.

Contract: ``generate`` submits each request of its list on its own (one bad request cannot sink the others) and
answers one ``Result`` per request, in the input order; every other method is one api call (``submit``, ``get``,
``wait`` with the long poll, ``abort``, ``delete``, ``image(s)``, ``video``; ``events`` and ``watch`` follow live
events, ``fusefleet.client_events``). Requests and answers are the wire models of ``shared.wire`` (importing this
module never loads the api); errors are typed (``fusefleet.client_errors``). The base url defaults to
``$FUSEFLEET_URL``, else ``http://127.0.0.1:8000``, the API key to ``$FUSEFLEET_API_KEY``.

Both classes only carry the calls out (HTTP, sleeps, callbacks): what each call sends, how its answer is read,
when it retries or waits is written once in ``fusefleet.client_protocol``; ``Result`` is ``fusefleet.client_results``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from fusefleet.client_errors import (
    ApiError,
    ApiUnreachable,
    Conflict,
    FieldError,
    FusefleetError,
    NotFound,
    QueueFull,
    RequestFailed,
    RequestRejected,
    Unavailable,
    WaitTimeout,
)
from fusefleet.client_events import RECONNECT_S, Event, Subscription, aread_events, read_events
from fusefleet.client_images import encode_image
from fusefleet.client_protocol import (
    DEFAULT_TIMEOUT_S,
    MAX_RETRY_WAIT_S,
    PROGRESS_INTERVAL_S,
    SUBMIT_RETRIES,
    All,
    Call,
    ClientProtocol,
    Drive,
    GenerateProgress,
    Generation,
    Op,
    ProgressCallback,
    RequestLike,
    Sleep,
    Step,
    build_request,
)
from fusefleet.client_results import Result, ResultError
from shared.contracts import OutputFormat, RequestStatus
from shared.wire import GenerateRequest, RequestView

__all__ = [
    "ApiError",
    "ApiUnreachable",
    "AsyncClient",
    "Client",
    "Conflict",
    "Event",
    "FieldError",
    "FusefleetError",
    "GenerateRequest",
    "NotFound",
    "OutputFormat",
    "QueueFull",
    "RequestFailed",
    "RequestRejected",
    "RequestStatus",
    "RequestView",
    "Result",
    "ResultError",
    "Unavailable",
    "WaitTimeout",
    "build_request",
    "encode_image",
]

_T = TypeVar("_T")


class Client(ClientProtocol):
    """Synchronous client of a fusefleet api.

    >>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     request_id = client.submit(prompt="a lighthouse at dusk", width=64, height=64, seed=42)
    ...     view = client.wait(request_id, timeout=60)
    ...     png = client.image(request_id, 0) if view.status == "succeeded" else None

    ``timeout`` bounds each HTTP call (a long poll gets its ``wait_s`` on top); ``transport`` replaces httpx's
    (tests); a 503 on submit, or an answer lost after the submission was sent, is retried ``submit_retries`` times
    after its ``Retry-After`` (at most ``max_retry_wait_s`` each), under the submission's own ``Idempotency-Key``: a
    retry is queued once.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        submit_retries: int = SUBMIT_RETRIES,
        max_retry_wait_s: float = MAX_RETRY_WAIT_S,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(base_url, timeout, submit_retries, max_retry_wait_s)
        self._http = httpx.Client(transport=transport, **self._http_options(headers, api_key))

    # --- lifecycle --------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- the transport: performs an op's steps ------------------------------------------------------------------
    def _run(self, op: Op[_T]) -> _T:
        drive = Drive(op)
        while drive.step is not None:
            try:
                outcome = self._perform(drive.step)
            except Exception as exc:
                drive.throw(exc)
            else:
                drive.send(outcome)
        return drive.answer

    def _perform(self, step: Step) -> Any:
        if isinstance(step, Call):
            return self._http.request(step.method, step.path, **step.request_options)
        if isinstance(step, All):
            return [self._run(op) for op in step.ops]
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
        else:
            step.callback(step.view)
        return None

    # --- the api ---------------------------------------------------------------------------------------------
    def submit(self, request: RequestLike | None = None, /, **params: Any) -> str:
        """Queue one request; its id. ``params`` set or replace fields (``submit(prompt="a fox", seed=1)``).

        Raises ``RequestRejected`` (invalid; ``.field`` names the field), ``QueueFull`` / ``Unavailable`` once
        ``submit_retries`` retries after ``Retry-After`` did not help, ``ApiUnreachable``.
        """
        return self._run(self._submit_op(build_request(request, overrides=params))).id

    def get(self, request_id: str) -> RequestView:
        """The current state of a request (``NotFound`` when unknown or expired)."""
        return self._run(self._view_op(request_id, 0.0))

    def wait(
        self,
        request_id: str,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
        *,
        poll_interval: float = PROGRESS_INTERVAL_S,
    ) -> RequestView:
        """Block until the request is terminal (succeeded, failed or aborted); its final state.

        Without ``on_progress`` it long-polls (one call per 30 s at most, answered the moment the request ends);
        with it, it reads every ``poll_interval`` seconds (still answered at once on the end) and calls
        ``on_progress(view)`` each time (``view.progress.step`` / ``.total``, ``view.status``). ``WaitTimeout``
        after ``timeout`` seconds (the request keeps running). Brief 503s and dropped connections are ridden
        out with backoff.
        """
        return self._run(self._wait_op(request_id, timeout, on_progress, poll_interval))

    def abort(self, request_id: str) -> RequestStatus:
        """Abort a request (idempotent); its status after the call: ``aborted``, ``running`` while its worker
        winds it down, or ``succeeded`` / ``failed`` when it had already finished (too late to abort)."""
        return self._run(self._abort_op(request_id))

    def delete(self, request_id: str) -> None:
        """Delete a finished (succeeded, failed or aborted) request: its state and its images, at once.

        ``Conflict`` while it is queued, scheduled or running (``abort`` it first, then delete it once it is
        aborted); ``NotFound`` when unknown, expired or already deleted.
        """
        self._run(self._delete_op(request_id))

    def image(self, request_id: str, index: int = 0) -> bytes:
        """Bytes of image ``index`` of a succeeded request, in its ``output_format`` (``NotFound`` when it does not
        exist (yet))."""
        return self._run(self._file_op(request_id, "images", index))

    def images(self, request_id: str, view: RequestView | None = None) -> list[bytes]:
        """Every image of the request (none unless it succeeded); ``view`` saves reading its state again."""
        return self._run(self._images_op(request_id, view))

    def video(self, request_id: str, index: int = 0) -> bytes:
        """MP4 bytes of video ``index`` of a succeeded video request (its frames are its ``images``)."""
        return self._run(self._file_op(request_id, "videos", index))

    def events(
        self, request_id: str, *, last_event_id: str | None = None, reconnect_s: float = RECONNECT_S
    ) -> Iterator[Event]:
        """The request's live events (``GET /v1/requests/{id}/events``), from the start or after ``last_event_id``,
        up to and including its terminal one (``event.view`` then holds its final state).

        >>> for event in client.events(request_id):  # doctest: +SKIP
        ...     print(event.name, event.data)  # queued, scheduled, running, progress (step/total), succeeded

        A dropped stream is opened again after the last event received, for up to ``reconnect_s`` seconds of
        consecutive failure (``fusefleet.client_events``); ``NotFound`` for an unknown request.
        """
        return self.watch([request_id], last_event_id=last_event_id, reconnect_s=reconnect_s)

    def watch(
        self, request_ids: Sequence[str], *, last_event_id: str | None = None, reconnect_s: float = RECONNECT_S
    ) -> Iterator[Event]:
        """The live events of several requests on one stream (``GET /v1/events?ids=``), in the order they happen
        (``event.request_id`` says whose), until each had its terminal event; as ``events``."""
        subscription = Subscription(request_ids, last_event_id, reconnect_s)
        return read_events(self._http, self.base_url, self.timeout, subscription)

    def generate(
        self,
        requests: Sequence[RequestLike],
        timeout: float | None = None,
        *,
        on_progress: GenerateProgress | None = None,
        **defaults: Any,
    ) -> list[Result]:
        """Run independent requests and collect their images: one ``Result`` per request, in the input order.

        Each request is validated and submitted on its own, in order (all are submitted before waiting, so the
        fleet can fuse them); a refused one gets ``id=None`` and its error, and the others run regardless.
        ``defaults`` fill the fields a request leaves unset. ``timeout`` bounds the whole call; a request still
        running then gets a ``WaitTimeout`` error (and keeps running). ``on_progress(index, view)`` reports
        progress (polling) while waiting. ``output_format="jpeg"`` (or ``"webp"``) and ``output_compression=N``
        among ``defaults`` (or in a request) choose how the images are encoded.

        >>> results = client.generate(["a red fox", "a blue whale"], num_inference_steps=4)  # doctest: +SKIP
        >>> [r.status for r in results]  # doctest: +SKIP
        [<RequestStatus.SUCCEEDED: 'succeeded'>, <RequestStatus.SUCCEEDED: 'succeeded'>]
        """
        generation = Generation(self, requests, timeout, on_progress, defaults)
        for index in generation.indices:
            self._run(generation.submit_op(index))
        for index in generation.indices:
            self._run(generation.finish_op(index))
        return generation.results()


class AsyncClient(ClientProtocol):
    """Asynchronous client of a fusefleet api (same methods as ``Client``, as coroutines).

    >>> async with AsyncClient() as client:  # doctest: +SKIP
    ...     results = await client.generate(["a red fox", "a blue whale"], width=64, height=64)
    ...     images = results[0].pil_images()

    ``generate`` submits and waits for its requests concurrently.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        submit_retries: int = SUBMIT_RETRIES,
        max_retry_wait_s: float = MAX_RETRY_WAIT_S,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(base_url, timeout, submit_retries, max_retry_wait_s)
        self._http = httpx.AsyncClient(transport=transport, **self._http_options(headers, api_key))

    # --- lifecycle --------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- the transport: performs an op's steps, the ops of an ``All`` concurrently -------------------------------
    async def _run(self, op: Op[_T]) -> _T:
        drive = Drive(op)
        while drive.step is not None:
            try:
                outcome = await self._perform(drive.step)
            except Exception as exc:
                drive.throw(exc)
            else:
                drive.send(outcome)
        return drive.answer

    async def _perform(self, step: Step) -> Any:
        if isinstance(step, Call):
            return await self._http.request(step.method, step.path, **step.request_options)
        if isinstance(step, All):
            return list(await asyncio.gather(*(self._run(op) for op in step.ops)))
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
        else:
            reported = step.callback(step.view)
            if inspect.isawaitable(reported):
                await reported
        return None

    # --- the api ---------------------------------------------------------------------------------------------
    async def submit(self, request: RequestLike | None = None, /, **params: Any) -> str:
        """Queue one request; its id (see ``Client.submit``)."""
        return (await self._run(self._submit_op(build_request(request, overrides=params)))).id

    async def get(self, request_id: str) -> RequestView:
        """The current state of a request (``NotFound`` when unknown or expired)."""
        return await self._run(self._view_op(request_id, 0.0))

    async def wait(
        self,
        request_id: str,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
        *,
        poll_interval: float = PROGRESS_INTERVAL_S,
    ) -> RequestView:
        """Wait until the request is terminal; its final state (see ``Client.wait``). ``on_progress`` may be a
        coroutine function."""
        return await self._run(self._wait_op(request_id, timeout, on_progress, poll_interval))

    async def abort(self, request_id: str) -> RequestStatus:
        """Abort a request (idempotent); its status after the call (see ``Client.abort``)."""
        return await self._run(self._abort_op(request_id))

    async def delete(self, request_id: str) -> None:
        """Delete a finished request: its state and its images (see ``Client.delete``)."""
        await self._run(self._delete_op(request_id))

    async def image(self, request_id: str, index: int = 0) -> bytes:
        """Bytes of image ``index`` of a succeeded request, in its ``output_format``."""
        return await self._run(self._file_op(request_id, "images", index))

    async def video(self, request_id: str, index: int = 0) -> bytes:
        """MP4 bytes of video ``index`` of a succeeded video request (see ``Client.video``)."""
        return await self._run(self._file_op(request_id, "videos", index))

    def events(
        self, request_id: str, *, last_event_id: str | None = None, reconnect_s: float = RECONNECT_S
    ) -> AsyncIterator[Event]:
        """``Client.events``: ``async for event in client.events(request_id)``."""
        return self.watch([request_id], last_event_id=last_event_id, reconnect_s=reconnect_s)

    def watch(
        self, request_ids: Sequence[str], *, last_event_id: str | None = None, reconnect_s: float = RECONNECT_S
    ) -> AsyncIterator[Event]:
        """``Client.watch``: ``async for event in client.watch(ids)``."""
        subscription = Subscription(request_ids, last_event_id, reconnect_s)
        return aread_events(self._http, self.base_url, self.timeout, subscription)

    async def images(self, request_id: str, view: RequestView | None = None) -> list[bytes]:
        """Every image of the request (none unless it succeeded), fetched concurrently."""
        return await self._run(self._images_op(request_id, view))

    async def generate(
        self,
        requests: Sequence[RequestLike],
        timeout: float | None = None,
        *,
        on_progress: GenerateProgress | None = None,
        **defaults: Any,
    ) -> list[Result]:
        """Run independent requests concurrently; one ``Result`` per request, in the input order (see
        ``Client.generate``). ``on_progress(index, view)`` may be a coroutine function."""
        generation = Generation(self, requests, timeout, on_progress, defaults)
        await asyncio.gather(*(self._run(generation.run_op(index)) for index in generation.indices))
        return generation.results()
