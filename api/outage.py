"""What the API does when Redis is down, stalled or still loading: 503 with ``Retry-After``, never a hang or a 500.

Every Redis call of the API goes through ``RequestStore``, which bounds it in time and turns whatever a failing
Redis raises (``redis.exceptions.ConnectionError``, ``TimeoutError``, ``BusyLoadingError`` while a restarted
Redis loads its AOF, or a bare ``OSError`` / ``asyncio.TimeoutError``) into ``StoreUnavailable``.
"""

from __future__ import annotations

from fastapi import Request, status
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

RETRY_AFTER_S = 5
RETRY_AFTER_DOC: dict[str, object] = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}
}
"""The ``headers`` entry of a documented 503 response."""
REDIS_FAILURES: tuple[type[BaseException], ...] = (RedisError, OSError)
"""What a Redis call raises when Redis fails; ``OSError`` covers ``TimeoutError`` (= ``asyncio.TimeoutError``)."""


REQUEST_STORE = "the request store (Redis)"


class StoreUnavailable(Exception):
    """Redis did not answer a call of the request store (refused, reset, timed out, loading), or the result store
    failed (``what`` says which)."""

    def __init__(self, cause: BaseException, what: str = REQUEST_STORE) -> None:
        super().__init__(f"{what} is unavailable: {type(cause).__name__}")
        self.cause = cause
        self.what = what


def unavailable_message(exc: Exception) -> str:
    """What failed, for a 503: the store and the error type (never internals such as hosts)."""
    if isinstance(exc, StoreUnavailable):
        return str(exc)
    return f"{REQUEST_STORE} is unavailable: {type(exc).__name__}"


def retry_after_headers() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


async def store_unavailable_response(request: Request, exc: Exception) -> JSONResponse:
    """503 ``{"detail": ...}`` with ``Retry-After`` for a Redis failure inside a route."""
    return JSONResponse(
        {"detail": unavailable_message(exc)},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers=retry_after_headers(),
    )

