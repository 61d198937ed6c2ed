"""Redis clients built from settings (string replies; a separate binary client where PNG bytes are read).

Every client has a socket timeout (``redis_socket_timeout_s``) and a connect timeout, so a stalled or unreachable
Redis becomes an error after a bounded time instead of a hang; each service decides what an error means for it.

``redis_cluster`` picks the ``Topology``: one Redis (``SINGLE``), or a Redis Cluster seeded by ``redis_url``
(``CLUSTER``: redis-py's cluster clients as ``shared.redis_cluster`` adapts them; they find every node from the
seed, follow ``MOVED`` after a failover and load a script on every master when a node answers ``NOSCRIPT``). Both
are typed as the plain clients: every key of a fleet carries its hash tag (``shared.keys.RedisKeys``), so each
command, script, pipeline and ``MULTI`` the services send names keys of one slot, which the cluster clients serve as
one Redis would; past ``max_connections`` an asyncio call waits for a free connection on either. One difference
remains: pub/sub subscribes at the node of the channel's slot (a ``PUBLISH`` reaches every node).
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from shared.redis_cluster import AsyncCluster, SyncCluster
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


class Topology:
    """How the clients of one deployment shape reach Redis."""

    def sync(self, url: str, **options: Any) -> redis.Redis:
        raise NotImplementedError

    def asyncio(self, url: str, max_connections: int, timeout_s: float, **options: Any) -> aioredis.Redis:
        """An asyncio client of at most ``max_connections`` calls at once; the next waits for a free connection
        (instead of failing) under bursts, at most ``timeout_s``."""
        raise NotImplementedError


class _Single(Topology):
    def sync(self, url: str, **options: Any) -> redis.Redis:
        return redis.Redis.from_url(url, **options)

    def asyncio(self, url: str, max_connections: int, timeout_s: float, **options: Any) -> aioredis.Redis:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, **options
        )
        return aioredis.Redis.from_pool(pool)


class _Cluster(Topology):
    def sync(self, url: str, **options: Any) -> redis.Redis:
        return cast(redis.Redis, SyncCluster.from_url(url, **options))

    def asyncio(self, url: str, max_connections: int, timeout_s: float, **options: Any) -> aioredis.Redis:
        client = AsyncCluster.from_url(url, max_connections=max_connections, wait_s=timeout_s, **options)
        return cast(aioredis.Redis, client)


SINGLE: Topology = _Single()
CLUSTER: Topology = _Cluster()


def topology(settings: Settings) -> Topology:
    """``CLUSTER`` with ``redis_cluster`` on, else ``SINGLE``."""
    return CLUSTER if settings.redis_cluster else SINGLE


def _options(settings: Settings, binary: bool) -> dict[str, Any]:
    return {
        "decode_responses": not binary,
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": 30,
    }


def sync_client(settings: Settings, *, binary: bool = False) -> redis.Redis:
    return topology(settings).sync(settings.redis_url, **_options(settings, binary))


def async_client(settings: Settings, *, binary: bool = False, max_connections: int | None = None) -> aioredis.Redis:
    """A client of at most ``max_connections`` connections (by default ``redis_max_connections``); a call past
    them waits for a free one (instead of failing) under bursts."""
    return topology(settings).asyncio(
        settings.redis_url,
        max_connections or settings.redis_max_connections,
        settings.redis_socket_timeout_s,
        **_options(settings, binary),
    )
