"""redis-py's Redis Cluster clients as fusefleet's services use them (``shared.redis_conn``'s ``CLUSTER`` topology).

Contract: a client here fails the way one Redis does. When no node of the cluster answers, or its slots are not all
served (a failover under way), redis-py raises ``RedisClusterException``, which is no ``RedisError``; these clients
raise ``ClusterUnreachable`` instead, a ``redis.ConnectionError``, so every service's outage handling (the api's
503, a worker's bounded retries, the listeners' resubscribe loops) covers a cluster as it covers one Redis. The
asyncio client's pub/sub also finds the cluster before its first ``SUBSCRIBE`` (redis/redis-py#4296: redis-py 8.1
raised ``KeyError`` there on a client that had sent nothing yet, fixed after 8.1 by #4297). And its ``MULTI``
pipeline queues a command as a pipeline does, finding the slots at ``execute``: redis-py 8.1 runs each queued
command of an asyncio cluster transaction in a thread of its own under ``asyncio.run`` (to find its slot) and
blocks the event loop until that thread ends; while the client is still finding the cluster (concurrent first
calls) the thread waits on a lock the blocked loop holds (a deadlock: the whole api hangs) or fails
(``RuntimeError``: a lock bound to another loop).

Not translated: a sync client built while no node answers fails at once (its constructor asks the seed for the
slots), and a pipeline's ``execute`` raises redis-py's exception as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.exceptions
from redis.asyncio.cluster import AbstractStrategy, ClusterPipeline, TransactionStrategy
from redis.asyncio.cluster import ClusterPubSub as AsyncClusterPubSub
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, SlotNotCoveredError

_OUTAGES: tuple[type[Exception], ...] = (
    RedisClusterException,
    SlotNotCoveredError,
    # redis-py 8.2: no node answered (before, a plain RedisClusterException)
    *(
        (redis.exceptions.RedisClusterUnreachableError,)
        if hasattr(redis.exceptions, "RedisClusterUnreachableError")
        else ()
    ),
)
"""redis-py's exceptions (exactly these types, not their other subclasses: those are misuse, such as a cross-slot
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


class _QueuedTransaction(TransactionStrategy):
    """An asyncio cluster ``MULTI`` pipeline that queues each command (no thread) and finds the slots, on the
    event loop, when it executes. ``WATCH`` (which fusefleet never sends) keeps redis-py's own path."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._watching or args[0] in self.IMMEDIATE_EXECUTE_COMMANDS:
            return super().execute_command(*args, **kwargs)
        return AbstractStrategy.execute_command(self, *args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        client = self._pipe.cluster_client
        try:
            await client.initialize()
        except Exception as exc:
            if _is_outage(exc):
                raise ClusterUnreachable(str(exc)) from exc
            raise
        for command in self._command_queue:
            if command.args[0] not in self.NO_SLOTS_COMMANDS:
                self._pipeline_slots.add(await client._determine_slot(*command.args))
        return await super().execute(raise_on_error, allow_redirections)


class _BoundedPipeline(ClusterPipeline):
    """A pipeline that executes in one of its client's call slots (``AsyncCluster``) and takes ``TIME``."""

    cluster_client: AsyncCluster

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        async with self.cluster_client.call_slot():
            return await super().execute(raise_on_error, allow_redirections)

    def time(self, **kwargs: Any) -> Any:
        """``TIME`` (the fleet's reads of its clock, ``shared.fleet_state``), which redis-py refuses in a cluster
        pipeline since it names no key: sent to any node, whose clock is the slot's master's on synced hosts."""
        return self.execute_command("TIME", **kwargs)


class AsyncCluster(AsyncRedisCluster):
    """asyncio ``RedisCluster`` raising ``ClusterUnreachable`` for an outage, with a pub/sub that initializes and
    ``MULTI`` pipelines that queue, whose calls wait for a free connection as one Redis's blocking pool makes them.

    redis-py's own asyncio cluster client does not wait: past ``max_connections`` of a node it raises
    ``MaxConnectionsError``, and its pipelines then drop the node's connections under the calls still using them
    (they fail with ``RuntimeError`` or ``AttributeError`` from a closed transport). Here at most ``max_connections``
    commands and pipelines run at once (every key of a fleet is on one node, so that node never holds more); the
    next waits for one to end, at most ``wait_s`` (then a ``redis.ConnectionError``). Pub/sub connections come on
    top: ``SUBSCRIPTIONS`` per node.
    """

    SUBSCRIPTIONS = 2
    """Pub/sub connections a process may hold on a node besides its calls (the api holds one: its completion
    listener)."""

    def __init__(self, *, max_connections: int = 100, wait_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(max_connections=max_connections + self.SUBSCRIPTIONS, **kwargs)
        self._calls = asyncio.Semaphore(max_connections)
        self._wait_s = wait_s

    @contextlib.asynccontextmanager
    async def call_slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_connections`` call slots (waiting at most ``wait_s`` for one)."""
        try:
            async with asyncio.timeout(self._wait_s):
                await self._calls.acquire()
        except TimeoutError:
            raise redis.ConnectionError(f"no free Redis connection within {self._wait_s} s") from None
        try:
            yield
        finally:
            self._calls.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.call_slot():
            try:
                return await super().execute_command(*args, **kwargs)
            except Exception as exc:
                if _is_outage(exc):
                    raise ClusterUnreachable(str(exc)) from exc
                raise

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # refused by redis-py
        pipe = _BoundedPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py builds its own
        if transaction:
            pipe._execution_strategy = _QueuedTransaction(pipe)
        return pipe

    def pubsub(self, node: Any = None, host: str | None = None, port: int | None = None, **kwargs: Any) -> Any:
        return _InitializingPubSub(self, node=node, host=host, port=port, **kwargs)
