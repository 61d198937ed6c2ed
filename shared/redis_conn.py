"""Redis clients built from settings (string replies; a separate binary client where PNG bytes are read).

Every client has a socket timeout (``redis_socket_timeout_s``) and a connect timeout, so a stalled or unreachable
Redis becomes an error after a bounded time instead of a hang; each service decides what an error means for it.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from shared.settings import Settings

CONNECT_TIMEOUT_S = 5.0


def sync_client(settings: Settings, *, binary: bool = False) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis_url,
        decode_responses=not binary,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
    )


def async_client(settings: Settings, *, binary: bool = False, max_connections: int | None = None) -> aioredis.Redis:
    """A client whose pool makes callers wait for a free connection (instead of failing) under bursts; its size is
    ``max_connections``, by default ``redis_max_connections``."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=max_connections or settings.redis_max_connections,
        timeout=settings.redis_socket_timeout_s,
        decode_responses=not binary,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)
