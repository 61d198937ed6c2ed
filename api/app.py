"""The FastAPI application: ``create_app`` wires settings, Redis clients, the request store and the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from redis import Redis as SyncRedis
from redis.exceptions import RedisError

from api.auth import AUTHENTICATED, UNAUTHORIZED, keys_watcher
from api.body_limit import BodyLimit
from api.events_feed import EventFeed
from api.metrics import ApiMetrics
from api.metrics import router as metrics_router
from api.openai import install as install_openai
from api.openapi import serve_limits
from api.outage import StoreUnavailable, store_unavailable_response
from api.routes import events, fleet, health, requests, ui
from api.store import RequestStore
from api.stream_slots import StreamSlots
from api.validation import validation_error_response
from api.waiter import CompletionWaiter
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys
from shared.redis_conn import async_client, sync_client
from shared.results import ResultStore, build_result_store
from shared.settings import Settings


def create_app(
    settings: Settings | None = None,
    *,
    redis: aioredis.Redis | None = None,
    results: ResultStore | None = None,
) -> FastAPI:
    """The API app. ``settings`` defaults to ``Settings()`` (environment).

    A client and result store passed in (tests inject fakeredis) are used as they are and left open; otherwise
    the lifespan creates a client from ``settings.redis_url`` and the result store ``settings.result_store``
    names, and closes what it created at shutdown.

    Bad input is a 4xx, never a 5xx: 422 with every echoed value JSON-safe (``api.validation``), 413 past
    ``max_body_bytes`` (``api.body_limit``). A Redis that is down, stalled or loading is a 503 with
    ``Retry-After`` within ``redis_socket_timeout_s`` (``api.outage``). The served OpenAPI document states
    this server's limits (``api.openapi``). With ``settings.api_keys_file`` every route but ``/healthz``,
    ``/metrics`` and the web page's static files (``api.routes.ui``) needs an API key, and a key sees only its
    own requests (``api.auth``); an invalid keys file raises ``KeysFileError`` here.
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
        binary: SyncRedis | None = None
        store = results
        if store is None:
            binary = sync_client(settings, binary=True)  # used by the Redis result store only
            # bounded like the api's Redis calls, and by the threads asyncio.to_thread may run (at most 32)
            store = build_result_store(settings, binary, call_timeout_s=settings.redis_socket_timeout_s, max_calls=32)
        keys = RedisKeys(settings.key_prefix)
        app.state.waiter = CompletionWaiter(text, keys.finished)
        await app.state.waiter.start(timeout_s=settings.redis_socket_timeout_s)
        app.state.store = RequestStore(
            text,
            store,
            keys,
            max_queue_len=settings.max_queue_len,
            max_input_bytes=settings.max_queued_input_bytes,
            result_ttl_s=settings.result_ttl_s,
            call_timeout_s=settings.redis_socket_timeout_s,
        )
        # event streams wait on connections of their own (api.events_feed), never starving the other routes
        streams = redis if redis is not None else async_client(settings, max_connections=settings.max_event_streams)
        if streams is not text:
            owned.append(streams)
        app.state.events = EventFeed(
            streams,
            app.state.store,
            keys,
            call_timeout_s=settings.redis_socket_timeout_s,
        )
        reader = FleetReader(text, keys, worker_ttl_s=settings.worker_ttl_s, timeout_s=settings.redis_socket_timeout_s)
        app.state.metrics.attach(app.state.store, reader)
        app.state.fleet = reader  # GET /v1/fleet (api/routes/fleet.py)
        try:
            yield
        finally:
            await app.state.waiter.stop()
            for client in owned:
                await client.aclose()
            if binary is not None:
                binary.close()

    app = FastAPI(title="fusefleet", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = ApiMetrics()  # GET /metrics (api.metrics), its own registry
    app.state.event_slots = StreamSlots(settings.max_event_streams, settings.max_event_streams_per_key)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    app.add_exception_handler(StoreUnavailable, store_unavailable_response)
    app.add_exception_handler(RedisError, store_unavailable_response)  # a Redis call outside the store
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes)
    app.state.api_keys = keys_watcher(settings.api_keys_file)  # None: no keys file, no authentication (api.auth)
    unauthorized = UNAUTHORIZED if app.state.api_keys is not None else None
    app.include_router(requests.router, dependencies=AUTHENTICATED, responses=unauthorized)
    app.include_router(  # Server-Sent Events of requests (api/routes/events.py)
        events.router, dependencies=AUTHENTICATED, responses=unauthorized
    )
    app.include_router(fleet.router, dependencies=AUTHENTICATED, responses=unauthorized)  # GET /v1/fleet
    app.include_router(health.router)
    app.include_router(ui.router)  # the web page, GET / (api/routes/ui.py): static, no key needed
    app.include_router(metrics_router)  # not in the OpenAPI schema
    install_openai(app, AUTHENTICATED)  # OpenAI Images API: its routes, errors in OpenAI's shape (api/openai/)
    serve_limits(app, settings)
    return app
