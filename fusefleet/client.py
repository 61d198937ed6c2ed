"""A Python client of the fusefleet HTTP api: ``Client`` (sync) and ``AsyncClient`` (asyncio), both on httpx.

Every prompt is its own request; ``generate`` takes a list of independent requests, submits each one on its own
(so one bad request cannot sink the others; the fleet still fuses compatible ones into one forward) and answers
one ``Result`` per request, in the input order::

    from fusefleet.client import Client

    with Client("http://127.0.0.1:8000") as client:
        results = client.generate(["a red fox", {"prompt": "a blue whale", "n": 2}], width=64, height=64, seed=1)
        for result in results:
            if result.ok:
                result.save("out")  # out/<id>-<k>.png (.jpeg or .webp with output_format="jpeg" or "webp")
            else:
                print(result.error)  # e.g. "RequestRejected: width: Input should be a multiple of 8"

Images come in the request's ``output_format`` (``png`` by default, ``jpeg`` or ``webp``, at ``output_compression``
0-100 for those two): ``generate([...], output_format="webp", output_compression=80)``.

The lower-level calls map one to one onto the api: ``submit`` (``POST /v1/requests``), ``get`` and ``wait``
(``GET /v1/requests/{id}``, ``wait`` with the long poll ``?wait_s=``), ``abort``, ``delete``
(``DELETE /v1/requests/{id}``), ``image`` and ``images``; ``events`` and ``watch`` follow one or several requests'
live events (Server-Sent Events, ``fusefleet.client_events``) until they end.
Requests and answers are the api's own pydantic models (``api.schemas.GenerateRequest``, ``RequestView``);
importing this module loads ``api.schemas`` (pydantic only), never the FastAPI app. Errors are typed
(``fusefleet.client_errors``): ``RequestRejected`` (422, naming the field), ``QueueFull`` / ``Unavailable`` (503,
with ``retry_after``; ``submit`` retries them a bounded number of times), ``NotFound``, ``Conflict``,
``ApiUnreachable``, ...

The base url defaults to ``$FUSEFLEET_URL``, else ``http://127.0.0.1:8000``; the API key (an api with
``FUSEFLEET_API_KEYS_FILE`` wants one) to ``$FUSEFLEET_API_KEY`` (``Client(url, api_key=...)``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from api.schemas import AbortResult, Accepted, GenerateRequest, RequestView
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
    error_from_response,
    unreachable,
)
from fusefleet.client_events import RECONNECT_S, Event, Subscription, aread_events, read_events
from fusefleet.client_images import encode_image, to_pil
from shared.contracts import OutputFormat, RequestStatus

if TYPE_CHECKING:
    from PIL import Image as PILImage

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

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "FUSEFLEET_URL"
API_KEY_ENV = "FUSEFLEET_API_KEY"
DEFAULT_TIMEOUT_S = 30.0
LONG_POLL_S = 30.0
"""``wait_s`` of one long poll (the api allows at most 60)."""
PROGRESS_INTERVAL_S = 0.5
"""How often ``wait(on_progress=...)`` reports, by default."""
SUBMIT_RETRIES = 3
MAX_RETRY_WAIT_S = 30.0
DEFAULT_RETRY_WAIT_S = 1.0
"""Wait before retrying a 503 that came without ``Retry-After``."""
WAIT_TRANSIENT_RETRIES = 5
"""Consecutive 503s or unanswered polls ``wait`` rides out (with backoff) before raising."""

RequestLike = GenerateRequest | Mapping[str, Any] | str
"""A request: the api's model, a dict of its fields, or (shorthand) just a prompt."""
ProgressCallback = Callable[[RequestView], object]
"""Called with each state ``wait`` reads; an ``AsyncClient`` also awaits it when it returns an awaitable."""
GenerateProgress = Callable[[int, RequestView], object]
"""Called with the index of the request in the input list and its state."""

_Model = TypeVar("_Model", bound=BaseModel)


def default_url() -> str:
    """``$FUSEFLEET_URL``, else ``http://127.0.0.1:8000``."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def with_api_key(headers: Mapping[str, str] | None, api_key: str | None) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer <api_key>`` (``api_key`` defaults to ``$FUSEFLEET_API_KEY``; an
    api with API keys wants it on every call), unless there is none or ``headers`` has an Authorization already."""
    merged = dict(headers or {})
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if key and not any(name.lower() == "authorization" for name in merged):
        merged["Authorization"] = f"Bearer {key}"
    return merged


def build_request(
    request: RequestLike | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GenerateRequest:
    """``request`` as a validated ``GenerateRequest``: ``defaults`` fill fields it leaves unset, ``overrides``
    replace fields. Invalid input raises ``RequestRejected`` (``status_code`` None, ``loc`` as the api's 422).

    >>> build_request("a red fox", overrides={"seed": 1}).seed
    1
    """
    if isinstance(request, GenerateRequest) and not defaults and not overrides:
        return request
    if isinstance(request, GenerateRequest):
        data: dict[str, Any] = request.model_dump(exclude_unset=True)
    elif isinstance(request, str):
        data = {"prompt": request}
    elif request is None:
        data = {}
    elif isinstance(request, Mapping):
        data = dict(request)
    else:
        raise TypeError(f"a request is a GenerateRequest, a dict of its fields or a prompt, not {type(request)}")
    try:
        return GenerateRequest.model_validate({**(defaults or {}), **data, **(overrides or {})})
    except ValidationError as exc:
        errors = [FieldError(loc=("body", *e["loc"]), msg=e["msg"], type=e["type"]) for e in exc.errors()]
        raise RequestRejected.from_field_errors(errors, status_code=None) from None


def request_body(request: GenerateRequest) -> dict[str, Any]:
    """The JSON body of ``request``: the fields it sets (the api fills in the others)."""
    return request.model_dump(mode="json", exclude_unset=True)


def _parse(model: type[_Model], response: httpx.Response) -> _Model:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ApiError(
            f"unexpected answer to {response.request.method} {response.request.url.path}: {exc}",
            status_code=response.status_code,
        ) from None


def _path(request_id: str, *rest: str | int) -> str:
    return "/".join(["/v1/requests", quote(request_id, safe=""), *(str(part) for part in rest)])


def _submit_retry_delay(exc: Unavailable, attempt: int, retries: int, max_wait_s: float) -> float | None:
    """Seconds to wait before retrying a refused submission, or None when the retries are used up."""
    if attempt >= retries:
        return None
    wait_s = exc.retry_after if exc.retry_after is not None else DEFAULT_RETRY_WAIT_S
    return min(wait_s, max_wait_s)


def _transient_delay(exc: FusefleetError, failures: int) -> float | None:
    """Backoff of ``wait`` after ``failures`` consecutive unanswered polls; None when it should give up."""
    if failures > WAIT_TRANSIENT_RETRIES:
        return None
    backoff = min(0.5 * 2 ** (failures - 1), 5.0)
    retry_after = exc.retry_after if isinstance(exc, Unavailable) else None
    return min(retry_after, 5.0) if retry_after is not None else backoff


def _not_a_list(requests: object) -> None:
    if isinstance(requests, str | Mapping | GenerateRequest):
        raise TypeError("generate() takes a list of requests (each its own request); use [request] for one")


@dataclass(frozen=True, slots=True)
class ResultError:
    """Why a request did not succeed: the worker's exception ``type`` and ``message``, or the client's error
    (``RequestRejected`` with the refused ``field``, ``QueueFull``, ``WaitTimeout``, ``Aborted``, ...)."""

    type: str
    message: str
    field: str | None = None

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    @classmethod
    def of(cls, exc: FusefleetError) -> ResultError:
        return cls(type(exc).__name__, exc.message, exc.field if isinstance(exc, RequestRejected) else None)


ABORTED = ResultError("Aborted", "the request was aborted")


@dataclass(slots=True)
class Result:
    """The outcome of one request of ``generate``.

    ``index`` is its place in the input list; ``request`` the validated request (None when the client refused
    it before sending); ``id`` is None when it was refused (never queued); ``status`` is its last known status
    (None when refused); ``error`` is None exactly when it succeeded; ``images`` holds its images (bytes, in
    ``output_format``); ``view`` is its last state as the api reported it.
    """

    index: int
    request: GenerateRequest | None
    id: str | None = None
    status: RequestStatus | None = None
    error: ResultError | None = None
    images: list[bytes] = field(default_factory=list)
    view: RequestView | None = None

    @property
    def ok(self) -> bool:
        return self.status is RequestStatus.SUCCEEDED and self.error is None

    @property
    def output_format(self) -> OutputFormat:
        """The encoding of ``images`` (also their file extension): as the api reports it, else as requested."""
        if self.view is not None:
            return self.view.params.output_format
        return self.request.output_format if self.request is not None else OutputFormat.PNG

    def pil_images(self) -> list[PILImage.Image]:
        """The images as PIL images. Needs Pillow (imported on first use; an ImportError says how to install it)."""
        return to_pil(self.images)

    def save(self, folder: str | os.PathLike[str], stem: str | None = None) -> list[Path]:
        """Write the images as ``folder/<stem or id>-<k>.<output_format>`` (``.png``, ``.jpeg`` or ``.webp``; the
        folder is created); the paths written."""
        if not self.images:
            return []
        name = stem or self.id or f"request{self.index}"
        extension = self.output_format.value
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for k, data in enumerate(self.images):
            path = out / f"{name}-{k}.{extension}"
            path.write_bytes(data)
            paths.append(path)
        return paths

    def raise_for_error(self) -> Self:
        """This result, or ``RequestFailed`` when the request did not succeed."""
        if self.error is not None:
            raise RequestFailed(self.id, self.error.type, self.error.message, self.error.field)
        return self


def _refused(index: int, request: GenerateRequest | None, exc: FusefleetError) -> Result:
    return Result(index=index, request=request, error=ResultError.of(exc))


def _finished(index: int, request: GenerateRequest, view: RequestView, images: list[bytes]) -> Result:
    error: ResultError | None = None
    if view.status is RequestStatus.FAILED:
        reported = view.error
        error = ResultError(reported.type, reported.message) if reported else ResultError("Failed", "no reason given")
    elif view.status is RequestStatus.ABORTED:
        error = ABORTED
    return Result(index, request, view.id, view.status, error, images, view)


def _interrupted(index: int, request: GenerateRequest, request_id: str, exc: FusefleetError) -> Result:
    """The request was accepted, but waiting for it or fetching its images failed."""
    view = exc.view if isinstance(exc, WaitTimeout) else None
    status = view.status if view is not None else RequestStatus.QUEUED
    return Result(index, request, request_id, status, ResultError.of(exc), [], view)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _Base:
    def __init__(self, base_url: str | None, timeout: float, submit_retries: int, max_retry_wait_s: float) -> None:
        self.base_url = (base_url or default_url()).rstrip("/")
        self.timeout = timeout
        self.submit_retries = submit_retries
        self.max_retry_wait_s = max_retry_wait_s

    def _http_timeout(self) -> httpx.Timeout:
        # no pool timeout: many concurrent long polls queue for a connection instead of failing
        return httpx.Timeout(self.timeout, pool=None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


class Client(_Base):
    """Synchronous client of a fusefleet api.

    >>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     request_id = client.submit(prompt="a lighthouse at dusk", width=64, height=64, seed=42)
    ...     view = client.wait(request_id, timeout=60)
    ...     png = client.image(request_id, 0) if view.status == "succeeded" else None

    ``timeout`` bounds each HTTP call (a long poll gets its ``wait_s`` on top); ``transport`` replaces httpx's
    (tests); a 503 on submit is retried ``submit_retries`` times after its ``Retry-After`` (at most
    ``max_retry_wait_s`` each).
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
        self._http = httpx.Client(  # redirects: images served from a presigned URL (result_delivery=redirect)
            base_url=self.base_url,
            timeout=self._http_timeout(),
            transport=transport,
            headers=with_api_key(headers, api_key),
            follow_redirects=True,
        )

    # --- lifecycle --------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- HTTP ----------------------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method,
                path,
                json=json,
                params=params,
                timeout=httpx.Timeout(timeout, pool=None) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        if not response.is_success:
            raise error_from_response(response)
        return response

    # --- the api ---------------------------------------------------------------------------------------------
    def submit(self, request: RequestLike | None = None, /, **params: Any) -> str:
        """Queue one request; its id. ``params`` set or replace fields (``submit(prompt="a fox", seed=1)``).

        Raises ``RequestRejected`` (invalid; ``.field`` names the field), ``QueueFull`` / ``Unavailable`` once
        ``submit_retries`` retries after ``Retry-After`` did not help, ``ApiUnreachable``.
        """
        return self._submit(build_request(request, overrides=params)).id

    def _submit(self, request: GenerateRequest) -> Accepted:
        body = request_body(request)
        attempt = 0
        while True:
            try:
                return _parse(Accepted, self._call("POST", "/v1/requests", json=body))
            except Unavailable as exc:
                delay = _submit_retry_delay(exc, attempt, self.submit_retries, self.max_retry_wait_s)
                if delay is None:
                    raise
            attempt += 1
            time.sleep(delay)

    def get(self, request_id: str) -> RequestView:
        """The current state of a request (``NotFound`` when unknown or expired)."""
        return self._view(request_id, 0.0)

    def _view(self, request_id: str, wait_s: float) -> RequestView:
        params = {"wait_s": round(wait_s, 3)} if wait_s > 0 else None
        timeout = self.timeout + wait_s if wait_s > 0 else None
        return _parse(RequestView, self._call("GET", _path(request_id), params=params, timeout=timeout))

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
        deadline = _deadline(timeout)
        view: RequestView | None = None
        failures = 0
        while True:
            wait_s = poll_interval if on_progress is not None else LONG_POLL_S
            left = _left(deadline)
            if left is not None:
                wait_s = min(wait_s, left)
            started = time.monotonic()
            try:
                view = self._view(request_id, wait_s)
            except (Unavailable, ApiUnreachable) as exc:
                failures += 1
                delay = _transient_delay(exc, failures)
                left = _left(deadline)
                if delay is None:
                    raise
                if left is not None and left <= 0:
                    raise WaitTimeout(request_id, timeout or 0.0, view) from exc
                time.sleep(delay if left is None else min(delay, left))
                continue
            failures = 0
            if on_progress is not None:
                on_progress(view)
            if view.status.terminal:
                return view
            left = _left(deadline)
            if left is not None and left <= 0:
                raise WaitTimeout(request_id, timeout or 0.0, view)
            # a server that does not hold the long poll must not turn this into a busy loop
            floor = min(wait_s, poll_interval) - (time.monotonic() - started)
            if floor > 0:
                time.sleep(floor)

    def abort(self, request_id: str) -> RequestStatus:
        """Abort a request (idempotent); its status after the call: ``aborted``, ``running`` while its worker
        winds it down, or ``succeeded`` / ``failed`` when it had already finished (too late to abort)."""
        try:
            response = self._call("POST", _path(request_id, "abort"))
        except Conflict:
            return self.get(request_id).status
        return _parse(AbortResult, response).status

    def delete(self, request_id: str) -> None:
        """Delete a finished (succeeded, failed or aborted) request: its state and its images, at once.

        ``Conflict`` while it is queued, scheduled or running (``abort`` it first, then delete it once it is
        aborted); ``NotFound`` when unknown, expired or already deleted.
        """
        self._call("DELETE", _path(request_id))

    def image(self, request_id: str, index: int = 0) -> bytes:
        """Bytes of image ``index`` of a succeeded request, in its ``output_format`` (``NotFound`` when it does not
        exist (yet))."""
        return self._call("GET", _path(request_id, "images", index)).content

    def images(self, request_id: str, view: RequestView | None = None) -> list[bytes]:
        """Every image of the request (none unless it succeeded); ``view`` saves reading its state again."""
        view = view if view is not None else self.get(request_id)
        return [self.image(request_id, k) for k in range(len(view.images))]

    def video(self, request_id: str, index: int = 0) -> bytes:
        """MP4 bytes of video ``index`` of a succeeded video request (its frames are its ``images``)."""
        return self._call("GET", _path(request_id, "videos", index)).content

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
        _not_a_list(requests)
        deadline = _deadline(timeout)
        built: list[GenerateRequest | RequestRejected] = []
        for item in requests:
            try:
                built.append(build_request(item, defaults=defaults))
            except RequestRejected as exc:
                built.append(exc)
        results: list[Result | None] = [None] * len(built)
        accepted: dict[int, tuple[GenerateRequest, Accepted]] = {}
        for i, req in enumerate(built):
            if isinstance(req, RequestRejected):
                results[i] = _refused(i, None, req)
                continue
            try:
                accepted[i] = (req, self._submit(req))
            except FusefleetError as exc:
                results[i] = _refused(i, req, exc)
        for i, (req, answer) in accepted.items():
            report = None if on_progress is None else _bind_index(on_progress, i)
            try:
                view = self.wait(answer.id, _left(deadline), report)
                images = self.images(answer.id, view) if view.status is RequestStatus.SUCCEEDED else []
                results[i] = _finished(i, req, view, images)
            except FusefleetError as exc:
                results[i] = _interrupted(i, req, answer.id, exc)
        return [result for result in results if result is not None]


def _bind_index(on_progress: GenerateProgress, index: int) -> ProgressCallback:
    def report(view: RequestView) -> object:
        return on_progress(index, view)

    return report


async def _maybe_await(value: object) -> None:
    if inspect.isawaitable(value):
        await value


class AsyncClient(_Base):
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
        self._http = httpx.AsyncClient(  # redirects: images served from a presigned URL (result_delivery=redirect)
            base_url=self.base_url,
            timeout=self._http_timeout(),
            transport=transport,
            headers=with_api_key(headers, api_key),
            follow_redirects=True,
        )

    # --- lifecycle --------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- HTTP ----------------------------------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            response = await self._http.request(
                method,
                path,
                json=json,
                params=params,
                timeout=httpx.Timeout(timeout, pool=None) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        if not response.is_success:
            raise error_from_response(response)
        return response

    # --- the api ---------------------------------------------------------------------------------------------
    async def submit(self, request: RequestLike | None = None, /, **params: Any) -> str:
        """Queue one request; its id (see ``Client.submit``)."""
        return (await self._submit(build_request(request, overrides=params))).id

    async def _submit(self, request: GenerateRequest) -> Accepted:
        body = request_body(request)
        attempt = 0
        while True:
            try:
                return _parse(Accepted, await self._call("POST", "/v1/requests", json=body))
            except Unavailable as exc:
                delay = _submit_retry_delay(exc, attempt, self.submit_retries, self.max_retry_wait_s)
                if delay is None:
                    raise
            attempt += 1
            await asyncio.sleep(delay)

    async def get(self, request_id: str) -> RequestView:
        """The current state of a request (``NotFound`` when unknown or expired)."""
        return await self._view(request_id, 0.0)

    async def _view(self, request_id: str, wait_s: float) -> RequestView:
        params = {"wait_s": round(wait_s, 3)} if wait_s > 0 else None
        timeout = self.timeout + wait_s if wait_s > 0 else None
        return _parse(RequestView, await self._call("GET", _path(request_id), params=params, timeout=timeout))

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
        deadline = _deadline(timeout)
        view: RequestView | None = None
        failures = 0
        while True:
            wait_s = poll_interval if on_progress is not None else LONG_POLL_S
            left = _left(deadline)
            if left is not None:
                wait_s = min(wait_s, left)
            started = time.monotonic()
            try:
                view = await self._view(request_id, wait_s)
            except (Unavailable, ApiUnreachable) as exc:
                failures += 1
                delay = _transient_delay(exc, failures)
                left = _left(deadline)
                if delay is None:
                    raise
                if left is not None and left <= 0:
                    raise WaitTimeout(request_id, timeout or 0.0, view) from exc
                await asyncio.sleep(delay if left is None else min(delay, left))
                continue
            failures = 0
            if on_progress is not None:
                await _maybe_await(on_progress(view))
            if view.status.terminal:
                return view
            left = _left(deadline)
            if left is not None and left <= 0:
                raise WaitTimeout(request_id, timeout or 0.0, view)
            floor = min(wait_s, poll_interval) - (time.monotonic() - started)
            if floor > 0:
                await asyncio.sleep(floor)

    async def abort(self, request_id: str) -> RequestStatus:
        """Abort a request (idempotent); its status after the call (see ``Client.abort``)."""
        try:
            response = await self._call("POST", _path(request_id, "abort"))
        except Conflict:
            return (await self.get(request_id)).status
        return _parse(AbortResult, response).status

    async def delete(self, request_id: str) -> None:
        """Delete a finished request: its state and its images (see ``Client.delete``)."""
        await self._call("DELETE", _path(request_id))

    async def image(self, request_id: str, index: int = 0) -> bytes:
        """Bytes of image ``index`` of a succeeded request, in its ``output_format``."""
        return (await self._call("GET", _path(request_id, "images", index))).content

    async def video(self, request_id: str, index: int = 0) -> bytes:
        """MP4 bytes of video ``index`` of a succeeded video request (see ``Client.video``)."""
        return (await self._call("GET", _path(request_id, "videos", index))).content

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
        view = view if view is not None else await self.get(request_id)
        return list(await asyncio.gather(*(self.image(request_id, k) for k in range(len(view.images)))))

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
        _not_a_list(requests)
        deadline = _deadline(timeout)
        built: list[GenerateRequest | RequestRejected] = []
        for item in requests:
            try:
                built.append(build_request(item, defaults=defaults))
            except RequestRejected as exc:
                built.append(exc)

        async def run(index: int, req: GenerateRequest | RequestRejected) -> Result:
            if isinstance(req, RequestRejected):
                return _refused(index, None, req)
            try:
                answer = await self._submit(req)
            except FusefleetError as exc:
                return _refused(index, req, exc)
            report = None if on_progress is None else _bind_index(on_progress, index)
            try:
                view = await self.wait(answer.id, _left(deadline), report)
                images = await self.images(answer.id, view) if view.status is RequestStatus.SUCCEEDED else []
            except FusefleetError as exc:
                return _interrupted(index, req, answer.id, exc)
            return _finished(index, req, view, images)

        return list(await asyncio.gather(*(run(i, req) for i, req in enumerate(built))))
