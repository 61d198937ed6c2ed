"""Redis clients built from settings (string replies; a separate binary client where PNG bytes are read)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from shared.settings import Settings

SOCKET_TIMEOUT_S = 30.0  # above every blocking read fusefleet issues (scheduler_block_ms <= 4 s)


def sync_client(settings: Settings, *, binary: bool = False) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis_url,
        decode_responses=not binary,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
    )


def async_client(settings: Settings, *, binary: bool = False) -> aioredis.Redis:
    """A client whose pool makes callers wait for a free connection (instead of failing) under bursts."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=SOCKET_TIMEOUT_S,
        decode_responses=not binary,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)
