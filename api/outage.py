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


class StoreUnavailable(Exception):
    """Redis did not answer a call of the request store (refused, reset, timed out, loading)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the request store (Redis) is unavailable: {type(cause).__name__}")
        self.cause = cause


def retry_after_headers() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


async def store_unavailable_response(request: Request, exc: Exception) -> JSONResponse:
    """503 ``{"detail": ...}`` with ``Retry-After`` for a Redis failure inside a route."""
    cause = exc.cause if isinstance(exc, StoreUnavailable) else exc
    return JSONResponse(
        {"detail": f"the request store (Redis) is unavailable: {type(cause).__name__}"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers=retry_after_headers(),
    )

