"""The errors of ``fusefleet.client``: one typed exception per way the api (or the way to it) can say no.

Everything the client raises on purpose is a ``FusefleetError``::

    FusefleetError
    ├── RequestRejected   the request is invalid (422 naming each field, 413, 400, or refused before sending)
    ├── NotFound          unknown or expired request id or image (404)
    ├── Conflict          the request already finished, or a submission under its key is in progress (409)
    ├── Unavailable       503: Redis down, stalled or loading; ``retry_after`` seconds
    │   └── QueueFull     503: the request queue is full (nothing was queued); ``retry_after`` seconds
    ├── ApiUnreachable    no answer at all (connection refused, reset, timed out)
    ├── WaitTimeout       ``wait()`` ran out of time before the request finished (also a ``TimeoutError``)
    ├── RequestFailed     ``Result.raise_for_error()``: the request failed, was aborted or refused
    └── ApiError          any other unexpected answer
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from shared.wire import RequestView

QUEUE_FULL_MARKER = "queue is full"
"""What the api's 503 ``detail`` says when the queue, not Redis, is the reason (``api.routes.requests``)."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """One entry of a 422 ``detail``: where (``loc``, e.g. ``("body", "width")``), what (``type``) and why."""

    loc: tuple[str | int, ...]
    msg: str
    type: str = "value_error"

    @property
    def field(self) -> str | None:
        """The field path inside the request body, dotted (``width``, ``lora.name``); None for the body itself."""
        parts = self.loc[1:] if self.loc and self.loc[0] == "body" else self.loc
        return ".".join(str(part) for part in parts) or None

    def __str__(self) -> str:
        return f"{self.field}: {self.msg}" if self.field else self.msg

    @classmethod
    def from_api(cls, item: Any) -> FieldError:
        """One item of FastAPI's 422 ``detail`` list (tolerant of anything else)."""
        if not isinstance(item, Mapping):
            return cls(loc=(), msg=str(item))
        loc = item.get("loc")
        parts = tuple(p if isinstance(p, int) else str(p) for p in loc) if isinstance(loc, list | tuple) else ()
        return cls(loc=parts, msg=str(item.get("msg", "")), type=str(item.get("type", "value_error")))


class FusefleetError(Exception):
    """Base of every error the client raises. ``status_code`` is the HTTP status, when there was an answer."""

    status_code: int | None = None

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code


class ApiError(FusefleetError):
    """An answer the client has no specific meaning for (e.g. a 500 from a proxy)."""


class RequestRejected(FusefleetError):
    """The request was refused as invalid; nothing was queued.

    ``errors`` lists every field error (the api's 422 ``detail``, or pydantic's when the client refused the
    request before sending it: then ``status_code`` is None); ``field`` is the first one's field.
    """

    def __init__(self, message: str, *, errors: Sequence[FieldError] = (), status_code: int | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.errors = list(errors)

    @property
    def field(self) -> str | None:
        return next((error.field for error in self.errors if error.field), None)

    @classmethod
    def from_field_errors(cls, errors: Sequence[FieldError], *, status_code: int | None) -> RequestRejected:
        message = "; ".join(str(error) for error in errors) or "the request is invalid"
        return cls(message, errors=errors, status_code=status_code)


class NotFound(FusefleetError):
    """Unknown request id (never submitted, or expired), or an image that does not exist (yet)."""

    status_code = 404


class Conflict(FusefleetError):
    """The request is not in a state that allows the call: aborting one that already succeeded or failed, or
    deleting one that has not finished yet; or a submission under the same ``Idempotency-Key`` is still in
    progress (``retry_after`` seconds: ``submit`` retries it)."""

    status_code = 409

    def __init__(self, message: str, *, retry_after: float | None = None, status_code: int | None = 409) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class Unavailable(FusefleetError):
    """503: the api cannot reach its Redis (down, stalled, loading). Retry after ``retry_after`` seconds."""

    status_code = 503

    def __init__(self, message: str, *, retry_after: float | None = None, status_code: int | None = 503) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class QueueFull(Unavailable):
    """503: the request queue is full; nothing was queued. Retry after ``retry_after`` seconds."""


class ApiUnreachable(FusefleetError):
    """No HTTP answer at all: the connection was refused, reset or timed out. ``cause`` is httpx's error."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class WaitTimeout(FusefleetError, TimeoutError):
    """``wait()`` gave up before the request finished; ``view`` is its last known state (it keeps running)."""

    def __init__(self, request_id: str, timeout: float, view: RequestView | None) -> None:
        status = view.status.value if view is not None else "unknown"
        super().__init__(f"request {request_id} did not finish within {timeout:g} s (last status: {status})")
        self.request_id = request_id
        self.timeout = timeout
        self.view = view


class RequestFailed(FusefleetError):
    """A request that did not succeed (failed in the worker, aborted, refused, or not finished in time).

    ``error_type`` is the worker's exception type (e.g. ``ValueError``) or the client's error class name.
    """

    def __init__(self, request_id: str | None, error_type: str, message: str, field: str | None = None) -> None:
        who = f"request {request_id}" if request_id else "request"
        super().__init__(f"{who}: {error_type}: {message}")
        self.request_id = request_id
        self.error_type = error_type
        self.error_message = message
        self.field = field


def parse_retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        from datetime import UTC, datetime

        seconds = (when - datetime.now(UTC)).total_seconds() if when.tzinfo else 0.0
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _detail(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, Mapping) and "detail" in body:
        return body["detail"]
    return body


def error_from_response(response: httpx.Response) -> FusefleetError:
    """The typed error of a non-2xx answer of the api."""
    status = response.status_code
    detail = _detail(response)
    if status == 422 or (status == 400 and isinstance(detail, list)):
        items = detail if isinstance(detail, list) else [detail]
        return RequestRejected.from_field_errors([FieldError.from_api(item) for item in items], status_code=status)
    text = detail if isinstance(detail, str) else str(detail)
    if status in (400, 413):
        return RequestRejected(text, status_code=status)
    if status == 404:
        return NotFound(text, status_code=status)
    if status == 409:
        return Conflict(text, retry_after=parse_retry_after(response.headers.get("Retry-After")), status_code=status)
    if status == 503:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        kind = QueueFull if QUEUE_FULL_MARKER in text else Unavailable
        return kind(text, retry_after=retry_after, status_code=status)
    return ApiError(f"HTTP {status}: {text}", status_code=status)


def unreachable(base_url: str, exc: httpx.TransportError) -> ApiUnreachable:
    what = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    reason = str(exc) or type(exc).__name__
    return ApiUnreachable(f"the fusefleet api at {base_url} {what}: {reason}", cause=exc)
