"""The FastAPI application: ``create_app`` wires settings, Redis clients, the request store and the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

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
from api.shard_router import ShardedFeed, ShardedFleet, ShardedStore, ShardedWaiter
from api.store import RequestStore, StateReads, Submissions
from api.stream_slots import StreamSlots
from api.validation import validation_error_response
from api.waiter import CompletionWaiter
from shared.fleet_state import FleetReader
from shared.keys import RedisKeys
from shared.redis_conn import async_client, sync_client
from shared.results import ResultStore, build_result_store
from shared.settings import Settings
from shared.shards import HOME, Shards


@dataclass(frozen=True, slots=True)
class _ShardParts:
    """What the api holds of one shard, each built from the shard's settings (``Shards.settings_of``)."""

    store: RequestStore
    waiter: CompletionWaiter
    events: EventFeed
    fleet: FleetReader


def _request_store(
    settings: Settings,
    text: aioredis.Redis,
    results: ResultStore | None,
    binary: SyncRedis | None,
    reads: StateReads | None = None,
    submissions: Submissions | None = None,
) -> RequestStore:
    """The request store of ``settings``' keys, with ``results`` (injected) or the result store they name, sharing
    ``reads`` and ``submissions`` (the state reads and submissions on ``text``) with the other shards' stores."""
    if results is None:
        assert binary is not None
        # bounded like the api's Redis calls, and by the threads asyncio.to_thread may run (at most 32)
        results = build_result_store(settings, binary, call_timeout_s=settings.redis_socket_timeout_s, max_calls=32)
    return RequestStore(
        text,
        results,
        RedisKeys(settings.key_prefix),
        max_queue_len=settings.max_queue_len,
        max_input_bytes=settings.max_queued_input_bytes,
        result_ttl_s=settings.result_ttl_s,
        call_timeout_s=settings.redis_socket_timeout_s,
        reads=reads,
        submissions=submissions,
    )


def _shard_parts(
    settings: Settings,
    text: aioredis.Redis,
    streams: aioredis.Redis,
    results: ResultStore | None,
    binary: SyncRedis | None,
    reads: StateReads,
    submissions: Submissions,
) -> _ShardParts:
    """The parts of the shard whose settings are ``settings``; ``streams`` is the event streams' own client."""
    keys = RedisKeys(settings.key_prefix)
    store = _request_store(settings, text, results, binary, reads, submissions)
    timeout_s = settings.redis_socket_timeout_s
    return _ShardParts(
        store=store,
        waiter=CompletionWaiter(text, keys.finished),
        events=EventFeed(streams, store, keys, call_timeout_s=timeout_s),
        fleet=FleetReader(text, keys, worker_ttl_s=settings.worker_ttl_s, timeout_s=timeout_s),
    )


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

    Each shard of the fleet (``shared.shards``; one without ``model_shards``) gets its own request store, completion
    waiter, event feed and fleet reader, built from its settings; a sharded fleet's routes reach them through
    ``api.shard_router``.
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
        binary = sync_client(settings, binary=True) if results is None else None  # the Redis result store's
        # event streams wait on connections of their own (api.events_feed), never starving the other routes
        streams = redis if redis is not None else async_client(settings, max_connections=settings.max_event_streams)
        if streams is not text:
            owned.append(streams)
        shards = Shards(settings)
        # one pipeline for every shard's state reads, one for its submissions
        reads = StateReads(text, settings.redis_socket_timeout_s)
        submissions = Submissions(text, settings.redis_socket_timeout_s)
        parts = {
            shard: _shard_parts(shards.settings_of(shard), text, streams, results, binary, reads, submissions)
            for shard in shards.names
        }
        if not shards.sharded:  # one shard, the fleet's own keys: its parts themselves
            (part,) = parts.values()
            app.state.store = part.store
            app.state.waiter = part.waiter
            app.state.events = part.events  # the SSE routes (api/routes/events.py)
            app.state.fleet = part.fleet  # GET /v1/fleet (api/routes/fleet.py), /metrics
        else:  # api.shard_router: by model, by id, and the fleet-wide reads over every shard
            home = (
                parts[HOME].store
                if HOME in parts
                else _request_store(settings, text, results, binary, reads, submissions)
            )
            app.state.store = ShardedStore(shards, {shard: part.store for shard, part in parts.items()}, home)
            app.state.waiter = ShardedWaiter(shards, {shard: part.waiter for shard, part in parts.items()})
            app.state.events = ShardedFeed(shards, {shard: part.events for shard, part in parts.items()})
            app.state.fleet = ShardedFleet([part.fleet for part in parts.values()])
        await app.state.waiter.start(timeout_s=settings.redis_socket_timeout_s)
        app.state.metrics.attach(app.state.store, app.state.fleet)
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
