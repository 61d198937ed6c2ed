"""Liveness: the API is healthy when Redis answers."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import StoreDep
from api.outage import RETRY_AFTER_DOC, retry_after_headers
from shared.wire import Health

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    responses={
        503: {
            "model": Health,
            "description": "Redis does not answer (refused, stalled past the socket timeout, or loading).",
            "headers": RETRY_AFTER_DOC,
        }
    },
)
async def healthz(store: StoreDep, response: Response) -> Health:
    """200 ``{"status": "ok"}`` when Redis answers PING, else 503 ``{"status": "unavailable"}`` with
    ``Retry-After``; never later than ``redis_socket_timeout_s``."""
    if await store.ping():
        return Health(status="ok")
    response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    response.headers.update(retry_after_headers())
    return Health(status="unavailable")
