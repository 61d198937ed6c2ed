"""The Celery broker of a test fleet when it is not the fleet's Redis: the RabbitMQ every session and CI run has
(``FUSEFLEET_TEST_RABBITMQ_URL``, default the local guest account), or a second plain Redis.

A fleet's queue follows its key prefix (``<prefix>.batches``), so fleets sharing one RabbitMQ never take each
other's batches; ``drop_queue`` deletes a fleet's queue (and the direct exchange Celery declares with it) once the
fleet has stopped, so a RabbitMQ that outlives many test runs does not collect them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import redis
from kombu import Connection

RABBITMQ_URL = os.environ.get("FUSEFLEET_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def rabbitmq_or_skip() -> str:
    """``RABBITMQ_URL`` if a broker answers there (within 5 s); else the test skips, saying where it looked."""
    try:
        with Connection(RABBITMQ_URL, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means: no RabbitMQ here
        pytest.skip(f"no RabbitMQ at {RABBITMQ_URL} ({exc}); set FUSEFLEET_TEST_RABBITMQ_URL")
    return RABBITMQ_URL


@dataclass(frozen=True)
class QueueState:
    """A broker queue as the broker reports it: messages waiting (not delivered) and consumers attached (RabbitMQ
    only; None on Redis, which has no such notion)."""

    waiting: int
    consumers: int | None


def redis_queue_key(key_prefix: str, queue: str) -> str:
    """The list holding ``queue``'s waiting messages in a Redis broker: every kombu key follows the fleet's key
    prefix (``shared.celery_config.broker_key_prefix``)."""
    return f"{key_prefix}:{queue}"


def queue_state(broker_url: str, queue: str, key_prefix: str) -> QueueState:
    """What the broker holds in ``queue`` (of the fleet of ``key_prefix``) now (a queue that does not exist: nothing
    waiting, no consumer)."""
    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        try:
            return QueueState(int(client.llen(redis_queue_key(key_prefix, queue))), None)
        finally:
            client.close()
    with Connection(broker_url, connect_timeout=5) as connection:
        try:
            declared = connection.default_channel.queue_declare(queue=queue, passive=True)
        except connection.channel_errors:  # NOT_FOUND: never declared, or dropped
            return QueueState(0, 0)
        return QueueState(int(declared.message_count), int(declared.consumer_count))


def drop_queue(broker_url: str, queue: str) -> None:
    """Delete ``queue`` and its exchange from a RabbitMQ (a Redis broker's list needs nothing: it is deleted when
    empty, and test brokers are private servers)."""
    if broker_url.startswith("redis"):
        return
    with Connection(broker_url, connect_timeout=5) as connection:
        channel = connection.default_channel
        channel.queue_delete(queue=queue)
        channel.exchange_delete(exchange=queue)


def purge_queue(broker_url: str, queue: str, key_prefix: str) -> int:
    """Delete every message waiting in ``queue`` (of the fleet of ``key_prefix``): a lost message, as far as the
    fleet can tell; how many."""
    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        key = redis_queue_key(key_prefix, queue)
        try:
            waiting = int(client.llen(key))
            client.delete(key)
            return waiting
        finally:
            client.close()
    with Connection(broker_url, connect_timeout=5) as connection:
        return int(connection.default_channel.queue_purge(queue=queue) or 0)
