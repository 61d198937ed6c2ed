"""The no-I/O half of ``fusefleet.client``: what each api call sends, how its answer is read, when it retries, waits
or gives up. ``Client`` and ``AsyncClient`` are the two transports that carry it out.

Each call is an *op*: a generator that yields ``Step``s and returns the call's answer. A transport performs each
step and sends its outcome back in (or throws its exception in, at the ``yield``):

- ``Call``: one HTTP request; the outcome is its ``httpx.Response`` (httpx's ``TransportError`` when none came);
- ``Sleep``: wait that many seconds; ``Report``: call a progress callback (an async transport awaits what it
  returns when that is awaitable); both have the outcome None;
- ``All``: run several ops (one after the other, or concurrently); the outcome is the list of their answers, or
  the first error.

So the retries of ``submit`` (503s, after ``Retry-After``), the long poll and backoff of ``wait``, the error of
each answer (``fusefleet.client_errors``) and the bookkeeping of ``generate`` (``Generation``) are written once.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from fusefleet.client_errors import (
    ApiError,
    ApiUnreachable,
    Conflict,
    FieldError,
    FusefleetError,
    RequestRejected,
    Unavailable,
    WaitTimeout,
    error_from_response,
    unreachable,
)
from fusefleet.client_results import Result, finished, interrupted, refused
from shared.contracts import RequestStatus
from shared.wire import AbortResult, Accepted, GenerateRequest, RequestView

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
"""Wait before retrying a 503 that came without ``Retry-After`` (or a submission whose answer was lost)."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
"""What makes a submission's retry safe (``api.idempotency``)."""
ANSWER_LOST = (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteError)
"""httpx's errors of a call that was sent (or partly) and got no answer: its submission may have been queued."""
WAIT_TRANSIENT_RETRIES = 5
"""Consecutive 503s or unanswered polls ``wait`` rides out (with backoff) before raising."""

RequestLike = GenerateRequest | Mapping[str, Any] | str
"""A request: the api's model, a dict of its fields, or (shorthand) just a prompt."""
ProgressCallback = Callable[[RequestView], object]
"""Called with each state ``wait`` reads; an ``AsyncClient`` also awaits it when it returns an awaitable."""
GenerateProgress = Callable[[int, RequestView], object]
"""Called with the index of the request in the input list and its state."""

_Model = TypeVar("_Model", bound=BaseModel)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request to the api: ``timeout`` (seconds) replaces the client's, for a long poll."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, Any] | None = None
    timeout: float | None = None
    headers: Mapping[str, str] | None = None

    @property
    def http_timeout(self) -> Any:  # httpx.Timeout or httpx.USE_CLIENT_DEFAULT
        """The ``timeout=`` of ``httpx.Client.request``: no pool timeout (long polls queue for a connection)."""
        return httpx.Timeout(self.timeout, pool=None) if self.timeout is not None else httpx.USE_CLIENT_DEFAULT

    @property
    def request_options(self) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` (and ``AsyncClient.request``) besides method and path."""
        return {"json": self.json, "params": self.params, "timeout": self.http_timeout, "headers": self.headers}


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (in a sync transport, blocking)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class All:
    """Run every op of ``ops``; a sync transport one after the other (stopping at the first error), an async one
    concurrently."""

    ops: Sequence[Op[Any]]


@dataclass(frozen=True, slots=True)
class Report:
    """Call ``callback(view)``."""

    callback: ProgressCallback
    view: RequestView


Step = Call | Sleep | All | Report
Op = Generator[Step, Any, _T]
"""A call: yields steps, is sent their outcomes (or has their errors thrown in), returns its answer."""


class Drive(Generic[_T]):
    """A transport's hold on one op: the ``step`` to perform next (None once the op returned its ``answer``)."""

    def __init__(self, op: Op[_T]) -> None:
        self._op = op
        self.answer = cast(_T, None)
        self.step: Step | None = None
        self._advance(None, None)

    def send(self, outcome: Any) -> None:
        """The outcome of ``step``."""
        self._advance(outcome, None)

    def throw(self, error: Exception) -> None:
        """``step`` raised ``error``: it is raised in the op, where the op yielded the step."""
        self._advance(None, error)

    def _advance(self, outcome: Any, error: Exception | None) -> None:
        try:
            self.step = self._op.send(outcome) if error is None else self._op.throw(error)
        except StopIteration as stop:
            self.step, self.answer = None, stop.value


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


def _submit_retry_delay(retry_after: float | None, attempt: int, retries: int, max_wait_s: float) -> float | None:
    """Seconds to wait before retrying a submission (after ``retry_after``, when the answer said), or None when the
    retries are used up."""
    if attempt >= retries:
        return None
    wait_s = retry_after if retry_after is not None else DEFAULT_RETRY_WAIT_S
    return min(wait_s, max_wait_s)


def _transient_delay(exc: FusefleetError, failures: int) -> float | None:
    """Backoff of ``wait`` after ``failures`` consecutive unanswered polls; None when it should give up."""
    if failures > WAIT_TRANSIENT_RETRIES:
        return None
    backoff = min(0.5 * 2 ** (failures - 1), 5.0)
    retry_after = exc.retry_after if isinstance(exc, Unavailable) else None
    return min(retry_after, 5.0) if retry_after is not None else backoff


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _bind_index(on_progress: GenerateProgress, index: int) -> ProgressCallback:
    def report(view: RequestView) -> object:
        return on_progress(index, view)

    return report


class ClientProtocol:
    """What a client knows (``base_url``, ``timeout``, the submit retry budget) and its calls as ops (``_*_op``)."""

    def __init__(self, base_url: str | None, timeout: float, submit_retries: int, max_retry_wait_s: float) -> None:
        self.base_url = (base_url or default_url()).rstrip("/")
        self.timeout = timeout
        self.submit_retries = submit_retries
        self.max_retry_wait_s = max_retry_wait_s

    def _http_options(self, headers: Mapping[str, str] | None, api_key: str | None) -> dict[str, Any]:
        """The options of the client's httpx client (redirects: images served from a presigned URL, with
        ``result_delivery=redirect``; no pool timeout: many concurrent long polls queue for a connection instead
        of failing)."""
        return {
            "base_url": self.base_url,
            "timeout": httpx.Timeout(self.timeout, pool=None),
            "headers": with_api_key(headers, api_key),
            "follow_redirects": True,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # --- ops -------------------------------------------------------------------------------------------------
    def _call_op(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Op[httpx.Response]:
        """One call; its answer when it is a 2xx, else its typed error."""
        try:
            response: httpx.Response = yield Call(method, path, json, params, timeout, headers)
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        if not response.is_success:
            raise error_from_response(response)
        return response

    def _submit_op(self, request: GenerateRequest) -> Op[Accepted]:
        """Submit under an ``Idempotency-Key`` of its own, so that a retry is queued once: after a 503, after a 409
        (the first try is still in progress), and after an answer lost once the call was sent (the connection
        reset, the read timed out), when the first try may have queued it; the api then answers the first try's id.
        (An api older than the header queues such a retry again.)"""
        body = request_body(request)
        headers = {IDEMPOTENCY_HEADER: uuid.uuid4().hex}
        attempt = 0
        while True:
            try:
                answer = yield from self._call_op("POST", "/v1/requests", json=body, headers=headers)
                return _parse(Accepted, answer)
            except (Unavailable, Conflict) as exc:  # a 409 here: the first try's submission is still in progress
                if isinstance(exc, Conflict) and exc.retry_after is None:
                    raise
                delay = _submit_retry_delay(exc.retry_after, attempt, self.submit_retries, self.max_retry_wait_s)
                if delay is None:
                    raise
            except ApiUnreachable as exc:
                if not isinstance(exc.cause, ANSWER_LOST):  # nothing was sent: the api is down, say so now
                    raise
                delay = _submit_retry_delay(None, attempt, self.submit_retries, self.max_retry_wait_s)
                if delay is None:
                    raise
            attempt += 1
            yield Sleep(delay)

    def _view_op(self, request_id: str, wait_s: float) -> Op[RequestView]:
        params = {"wait_s": round(wait_s, 3)} if wait_s > 0 else None
        timeout = self.timeout + wait_s if wait_s > 0 else None
        return _parse(RequestView, (yield from self._call_op("GET", _path(request_id), params=params, timeout=timeout)))

    def _wait_op(
        self, request_id: str, timeout: float | None, on_progress: ProgressCallback | None, poll_interval: float
    ) -> Op[RequestView]:
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
                view = yield from self._view_op(request_id, wait_s)
            except (Unavailable, ApiUnreachable) as exc:
                failures += 1
                delay = _transient_delay(exc, failures)
                left = _left(deadline)
                if delay is None:
                    raise
                if left is not None and left <= 0:
                    raise WaitTimeout(request_id, timeout or 0.0, view) from exc
                yield Sleep(delay if left is None else min(delay, left))
                continue
            failures = 0
            if on_progress is not None:
                yield Report(on_progress, view)
            if view.status.terminal:
                return view
            left = _left(deadline)
            if left is not None and left <= 0:
                raise WaitTimeout(request_id, timeout or 0.0, view)
            # a server that does not hold the long poll must not turn this into a busy loop
            floor = min(wait_s, poll_interval) - (time.monotonic() - started)
            if floor > 0:
                yield Sleep(floor)

    def _abort_op(self, request_id: str) -> Op[RequestStatus]:
        try:
            response = yield from self._call_op("POST", _path(request_id, "abort"))
        except Conflict:
            return (yield from self._view_op(request_id, 0.0)).status
        return _parse(AbortResult, response).status

    def _delete_op(self, request_id: str) -> Op[None]:
        yield from self._call_op("DELETE", _path(request_id))

    def _file_op(self, request_id: str, kind: str, index: int) -> Op[bytes]:
        """The bytes of ``images/{index}`` or ``videos/{index}`` of a request."""
        return (yield from self._call_op("GET", _path(request_id, kind, index))).content

    def _images_op(self, request_id: str, view: RequestView | None) -> Op[list[bytes]]:
        view = view if view is not None else (yield from self._view_op(request_id, 0.0))
        images: list[bytes] = yield All([self._file_op(request_id, "images", k) for k in range(len(view.images))])
        return images


class Generation:
    """The requests of one ``generate`` call and how far each got: built (or refused) at once, then ``submit_op``
    and ``finish_op`` per index (``run_op`` is both), then ``results``."""

    def __init__(
        self,
        client: ClientProtocol,
        requests: Sequence[RequestLike],
        timeout: float | None,
        on_progress: GenerateProgress | None,
        defaults: Mapping[str, Any],
    ) -> None:
        if isinstance(requests, str | Mapping | GenerateRequest):
            raise TypeError("generate() takes a list of requests (each its own request); use [request] for one")
        self._client = client
        self._deadline = _deadline(timeout)
        self._on_progress = on_progress
        self._built: list[GenerateRequest | RequestRejected] = []
        for item in requests:
            try:
                self._built.append(build_request(item, defaults=defaults))
            except RequestRejected as exc:
                self._built.append(exc)
        self._results: list[Result | None] = [None] * len(self._built)
        self._accepted: dict[int, tuple[GenerateRequest, Accepted]] = {}

    @property
    def indices(self) -> range:
        return range(len(self._built))

    def submit_op(self, index: int) -> Op[None]:
        """Submit request ``index``; a refused one (by the client or the api) has its result now."""
        req = self._built[index]
        if isinstance(req, RequestRejected):
            self._results[index] = refused(index, None, req)
            return
        try:
            self._accepted[index] = (req, (yield from self._client._submit_op(req)))
        except FusefleetError as exc:
            self._results[index] = refused(index, req, exc)

    def finish_op(self, index: int) -> Op[None]:
        """Wait for accepted request ``index`` (within the call's timeout) and fetch its images."""
        if index not in self._accepted:
            return
        req, answer = self._accepted[index]
        report = None if self._on_progress is None else _bind_index(self._on_progress, index)
        client = self._client
        try:
            view = yield from client._wait_op(answer.id, _left(self._deadline), report, PROGRESS_INTERVAL_S)
            succeeded = view.status is RequestStatus.SUCCEEDED
            images = (yield from client._images_op(answer.id, view)) if succeeded else []
            self._results[index] = finished(index, req, view, images)
        except FusefleetError as exc:
            self._results[index] = interrupted(index, req, answer.id, exc)

    def run_op(self, index: int) -> Op[None]:
        yield from self.submit_op(index)
        yield from self.finish_op(index)

    def results(self) -> list[Result]:
        """One ``Result`` per request, in the input order."""
        return [result for result in self._results if result is not None]
