"""Liveness: the API is healthy when Redis answers."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import StoreDep
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"model": Health, "description": "Redis does not answer."}})
async def healthz(store: StoreDep, response: Response) -> Health:
    """200 ``{"status": "ok"}`` when Redis answers PING, else 503 ``{"status": "unavailable"}``."""
    if await store.ping():
        return Health(status="ok")
    response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="unavailable")
