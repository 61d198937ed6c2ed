"""Redis clients built from settings (string replies; a separate binary client where PNG bytes are read).

Every client has a socket timeout (``redis_socket_timeout_s``) and a connect timeout, so a stalled or unreachable
Redis becomes an error after a bounded time instead of a hang; each service decides what an error means for it.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from shared.settings import Settings

CONNECT_TIMEOUT_S = 5.0
REDACTED = "***"
_SECRET_PARAMS = frozenset({"password"})


def redacted(url: str) -> str:
    """``url`` as it may be printed or logged: a password (``redis://user:pw@host``, ``redis://:pw@host`` or a
    ``?password=`` parameter) becomes ``***``; the scheme, user, host, port and database stay readable.

    Every place that shows a Redis or broker URL passes it through here first.
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{hostport}" if has_password else f"{userinfo}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name.lower() in _SECRET_PARAMS for name, _ in pairs):
            query = urlencode([(n, REDACTED if n.lower() in _SECRET_PARAMS else v) for n, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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
