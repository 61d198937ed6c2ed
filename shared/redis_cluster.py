"""redis-py's Redis Cluster clients as fusefleet's services use them (``shared.redis_conn``'s ``CLUSTER`` topology).

Contract: a client here fails the way one Redis does. When no node of the cluster answers, or its slots are not all
served (a failover under way), redis-py raises ``RedisClusterException``, which is no ``RedisError``; these clients
raise ``ClusterUnreachable`` instead, a ``redis.ConnectionError``, so every service's outage handling (the api's
503, a worker's bounded retries, the listeners' resubscribe loops) covers a cluster as it covers one Redis. The
asyncio client's pub/sub also finds the cluster before its first ``SUBSCRIBE`` (redis/redis-py#4296: redis-py 8.1
raised ``KeyError`` there on a client that had sent nothing yet, fixed after 8.1 by #4297).

Not translated: a sync client built while no node answers fails at once (its constructor asks the seed for the
slots), and a pipeline's ``execute`` raises redis-py's exception as it is.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.asyncio.cluster import ClusterPubSub as AsyncClusterPubSub
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, SlotNotCoveredError

_OUTAGES = (RedisClusterException, SlotNotCoveredError)
"""redis-py's exceptions (exactly these types, not their subclasses: those are misuse, such as a cross-slot
transaction) that mean the cluster cannot serve now."""


class ClusterUnreachable(redis.ConnectionError):
    """No node of the Redis Cluster answered, or not every slot has a master yet."""


def _is_outage(exc: BaseException) -> bool:
    return type(exc) in _OUTAGES


class SyncCluster(RedisCluster):
    """``RedisCluster`` raising ``ClusterUnreachable`` for an outage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)
        except Exception as exc:
            if _is_outage(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except Exception as exc:
            if _is_outage(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise


class _InitializingPubSub(AsyncClusterPubSub):
    """A pub/sub whose client finds the cluster before it routes a command (as every other command does)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await self.cluster.initialize()
        except Exception as exc:
            if _is_outage(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise
        return await super().execute_command(*args, **kwargs)


class AsyncCluster(AsyncRedisCluster):
    """asyncio ``RedisCluster`` raising ``ClusterUnreachable`` for an outage, with a pub/sub that initializes."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except Exception as exc:
            if _is_outage(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise

    def pubsub(self, node: Any = None, host: str | None = None, port: int | None = None, **kwargs: Any) -> Any:
        return _InitializingPubSub(self, node=node, host=host, port=port, **kwargs)
