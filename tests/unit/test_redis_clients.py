"""``shared.redis_conn``'s clients: ``redis_cluster`` picks redis-py's cluster clients (``shared.redis_cluster``),
and a cluster no node of which answers fails as one Redis does, with a ``redis.ConnectionError`` (redis-py's own
``RedisClusterException`` is no ``RedisError``, so no service's outage handling would see it)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from fusefleet.valkey import free_port
from shared.redis_cluster import AsyncCluster, ClusterUnreachable, SyncCluster
from shared.redis_conn import CLUSTER, SINGLE, async_client, sync_client, topology
from shared.settings import Settings


def nowhere(*, cluster: bool) -> Settings:
    """Settings whose Redis is a port nothing listens on."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    broker = {"broker_url": "amqp://guest:guest@127.0.0.1:5672//"} if cluster else {}
    return Settings(redis_url=url, redis_cluster=cluster, redis_socket_timeout_s=1.0, **broker)


def test_the_topology_follows_redis_cluster() -> None:
    assert topology(nowhere(cluster=False)) is SINGLE and topology(nowhere(cluster=True)) is CLUSTER
    assert type(sync_client(nowhere(cluster=False))) is redis.Redis
    assert type(async_client(nowhere(cluster=False))) is aioredis.Redis
    assert isinstance(async_client(nowhere(cluster=True)), AsyncCluster)


def test_a_sync_cluster_client_with_no_node_answering_is_a_connection_error() -> None:
    with pytest.raises(redis.ConnectionError) as raised:
        sync_client(nowhere(cluster=True))  # the constructor asks the seed for the slots
    assert isinstance(raised.value, ClusterUnreachable) and "cannot be connected" in str(raised.value)
    assert issubclass(SyncCluster, redis.cluster.RedisCluster)


@pytest.mark.anyio
async def test_an_async_cluster_client_with_no_node_answering_is_a_connection_error() -> None:
    client = async_client(nowhere(cluster=True))
    with pytest.raises(ClusterUnreachable):
        await client.get("{t}:x")
    pubsub = client.pubsub()
    with pytest.raises(ClusterUnreachable):  # redis-py 8.1 alone: KeyError (redis/redis-py#4296)
        await pubsub.subscribe("{t}:finished")
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()


@pytest.mark.anyio
async def test_an_async_cluster_call_past_max_connections_waits_then_fails_bounded() -> None:
    client = AsyncCluster(host="127.0.0.1", port=free_port(), max_connections=1, wait_s=0.2)
    async with client.call_slot():
        started = asyncio.get_running_loop().time()
        with pytest.raises(redis.ConnectionError, match="no free Redis connection within 0.2 s"):
            async with client.call_slot():
                pass
        assert 0.15 <= asyncio.get_running_loop().time() - started < 2.0
    async with client.call_slot():  # given back
        pass
    await client.aclose()
