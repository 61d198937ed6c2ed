"""The FastAPI application: ``create_app`` wires settings, Redis clients, the request store and the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.routes import health, requests
from api.store import RequestStore
from api.waiter import CompletionWaiter
from shared.keys import RedisKeys
from shared.redis_conn import async_client
from shared.settings import Settings

REDIS_DOWN_RETRY_AFTER_S = 5


async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """Any Redis failure inside a route: 503 with Retry-After instead of a bare 500."""
    return JSONResponse(
        {"detail": f"the request store (Redis) is unavailable: {type(exc).__name__}"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(REDIS_DOWN_RETRY_AFTER_S)},
    )


def create_app(
    settings: Settings | None = None,
    *,
    redis: aioredis.Redis | None = None,
    redis_binary: aioredis.Redis | None = None,
) -> FastAPI:
    """The API app. ``settings`` defaults to ``Settings()`` (environment).

    Clients passed in (tests inject fakeredis) are used as they are and left open; otherwise the lifespan
    creates a string and a binary client from ``settings.redis_url`` and closes them at shutdown.
    """
    # (mypy without the pydantic plugin misses the positional Field defaults of Settings)
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned: list[aioredis.Redis] = []
        text = redis
        if text is None:
            text = async_client(settings)
            owned.append(text)
        binary = redis_binary
        if binary is None:
            binary = async_client(settings, binary=True)
            owned.append(binary)
        keys = RedisKeys(settings.key_prefix)
        app.state.waiter = CompletionWaiter(text, keys.finished)
        await app.state.waiter.start()
        app.state.store = RequestStore(
            text,
            binary,
            keys,
            max_queue_len=settings.max_queue_len,
            result_ttl_s=settings.result_ttl_s,
        )
        try:
            yield
        finally:
            await app.state.waiter.stop()
            for client in owned:
                await client.aclose()

    app = FastAPI(title="fusefleet", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.add_exception_handler(RedisError, _redis_unavailable)
    app.include_router(requests.router)
    app.include_router(health.router)
    return app
