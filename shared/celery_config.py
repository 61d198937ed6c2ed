"""The Celery application both sides agree on: JSON only, late acks, one batch at a time per worker process.

The scheduler only publishes (by task name, with ``publish_options``); the worker registers the task on the same
configuration. The broker is ``settings.celery_broker_url``: a plain Redis (the fleet's own by default) or RabbitMQ.
What differs between the two is one ``BrokerTransport`` each, chosen by the URL's scheme (``broker_transport``):

- both: the task message is acknowledged after the task returns (``acks_late``) and given back when its pool process
  dies (``reject_on_worker_lost``), so a batch may be delivered more than once; ``claim.lua`` runs it once (one run at
  a time, writes fenced by the claim token). A publish is bounded: ``publish_options`` caps one attempt's wait for the
  broker, and Celery's publish retry policy the attempts.
- Redis: an unacknowledged message comes back after ``visibility_timeout_s`` (above the hard time limit, so a running
  batch is never delivered twice for that reason); the scheduler's reaper republishes a lost run's batch long before.
  Kombu's Redis transport has no socket timeouts unless given: a Redis that stops answering would block a publish.
- RabbitMQ (``amqp://``, py-amqp): a publish waits for the broker's confirm (``confirm_publish``), so a message the
  broker did not take raises instead of vanishing, and the sockets have read and write timeouts, so a broker that
  stops reading (a resource alarm blocks publishers) fails a publish instead of hanging it; an unacknowledged
  message comes back as soon as its consumer's connection closes (a worker killed, a broker restart), and RabbitMQ
  closes a consumer that holds a message longer than its ``consumer_timeout`` (30 min by default: keep
  ``batch_time_limit_s`` below it). The worker's connection carries AMQP heartbeats (``BROKER_HEARTBEAT_S``), so a
  silent broker is noticed without waiting on TCP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from celery import Celery

from shared.redis_conn import CONNECT_TIMEOUT_S
from shared.routing import model_queue, worker_queue
from shared.settings import Settings

RUN_BATCH_TASK = "fusefleet.run_batch"

BROKER_HEARTBEAT_S = 20.0
"""AMQP heartbeat of a worker's broker connection: a broker that stops answering is noticed within about twice this
(RabbitMQ, the other side, closes the connection after two missed heartbeats and requeues what it held)."""

RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0
"""RabbitMQ's default ``consumer_timeout``: a delivery unacknowledged this long closes its consumer's channel."""


@dataclass(frozen=True)
class BrokerTransport:
    """How fusefleet talks to one kind of broker: Celery's settings for it and the bounds of one publish."""

    name: str

    def conf(self, settings: Settings) -> dict[str, Any]:
        """Celery settings that only this transport needs (merged over the common ones)."""
        raise NotImplementedError

    def publish_options(self, settings: Settings) -> dict[str, Any]:
        """Keyword arguments of every ``send_task``: the longest one attempt may wait for the broker."""
        return {}

    def warnings(self, settings: Settings) -> list[str]:
        """What in ``settings`` this broker is likely to break (the worker logs each line at start)."""
        return []


def broker_key_prefix(settings: Settings) -> str:
    """What every key kombu writes in a Redis broker starts with: the fleet's key prefix (``<key_prefix>:``), so two
    fleets on one Redis share none of them (their queues, the unacknowledged messages' hash and index, the exchange
    bindings, the remote-control fanout a worker's ``consume`` broadcasts on)."""
    return f"{settings.key_prefix}:"


@dataclass(frozen=True)
class RedisTransport(BrokerTransport):
    """Kombu's Redis transport: messages in a list named after the queue, unacknowledged ones in a hash until
    acknowledged or restored after the visibility timeout; every key after the fleet's prefix
    (``broker_key_prefix``)."""

    def conf(self, settings: Settings) -> dict[str, Any]:
        transport = {
            "global_keyprefix": broker_key_prefix(settings),
            "visibility_timeout": settings.visibility_timeout_s,
            # no socket timeouts by default: a Redis that stops answering without closing TCP would block a publish
            # (the scheduler's dispatch, lease renewal and reaper) forever.
            "socket_timeout": settings.redis_socket_timeout_s,
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "socket_keepalive": True,
        }
        return {"broker_transport_options": transport, "result_backend_transport_options": transport}


@dataclass(frozen=True)
class AmqpTransport(BrokerTransport):
    """py-amqp on RabbitMQ: durable queue, persistent messages, publisher confirms, heartbeats on the worker."""

    def conf(self, settings: Settings) -> dict[str, Any]:
        timeout = settings.redis_socket_timeout_s
        return {
            "broker_transport_options": {
                # each publish waits for RabbitMQ's basic.ack: a message it refuses (nack, a closed channel) raises
                "confirm_publish": True,
                # socket timeouts: a broker that stops reading (a resource alarm blocks publishers) fails a call
                # instead of hanging it; kombu's closing of a failed channel waits on the socket too
                "read_timeout": timeout,
                "write_timeout": timeout,
            },
            "broker_heartbeat": BROKER_HEARTBEAT_S,
        }

    def publish_options(self, settings: Settings) -> dict[str, Any]:
        # without them a confirm is awaited forever: the socket write and the confirm are each bounded
        return {"timeout": settings.redis_socket_timeout_s, "confirm_timeout": settings.redis_socket_timeout_s}

    def warnings(self, settings: Settings) -> list[str]:
        if settings.batch_time_limit_s < RABBITMQ_CONSUMER_TIMEOUT_S:
            return []
        return [
            f"batch_time_limit_s ({settings.batch_time_limit_s}) is not below RabbitMQ's default consumer_timeout "
            f"({RABBITMQ_CONSUMER_TIMEOUT_S:.0f} s): a batch running that long has its message requeued; raise "
            "consumer_timeout in rabbitmq.conf above it"
        ]


TRANSPORTS: dict[str, BrokerTransport] = {
    "redis": RedisTransport("redis"),
    "rediss": RedisTransport("redis"),
    "amqp": AmqpTransport("amqp"),
    "amqps": AmqpTransport("amqp"),
    "pyamqp": AmqpTransport("amqp"),
}
"""The brokers fusefleet supports, by URL scheme."""


def broker_transport(settings: Settings) -> BrokerTransport:
    """The transport of ``settings.celery_broker_url``; a ValueError naming broker_url for any other scheme."""
    scheme = urlsplit(settings.celery_broker_url).scheme.lower()
    transport = TRANSPORTS.get(scheme)
    if transport is None:
        schemes = ", ".join(f"{name}://" for name in TRANSPORTS)
        raise ValueError(f"broker_url: unsupported scheme {scheme!r} (fusefleet supports {schemes})")
    return transport


def queues_in_fleet_redis(settings: Settings, workers: Callable[[], Iterable[str]] = tuple) -> tuple[str, ...]:
    """The keys of every queue a batch may wait in, in the fleet's own Redis when that Redis is the broker (kombu's
    Redis transport keeps a queue's waiting messages in a list named after it, ``broker_key_prefix`` first): each
    model's queue, then, in a fleet of several models, the own queue of each worker ``workers()`` names (called only
    then; the live ones: a batch placed on a gone worker is published again, ``shared.routing``). Empty on any other
    broker: the scheduler's reaper cannot see there whether a batch's message still waits, and publishes an
    unclaimed batch again after ``batch_claim_timeout_s`` (a copy still waiting then finds it claimed or done)."""
    if settings.celery_broker_url != settings.redis_url:
        return ()
    names = [model_queue(settings, model) for model in settings.catalog]
    if len(settings.catalog) > 1:
        names += [worker_queue(settings, worker) for worker in workers()]
    return tuple(broker_key_prefix(settings) + name for name in names)


def publish_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments the scheduler gives every ``send_task`` on this broker."""
    return broker_transport(settings).publish_options(settings)


def make_celery(settings: Settings) -> Celery:
    """A Celery app bound to the fleet's broker, configured for long, exclusive GPU tasks."""
    transport = broker_transport(settings)
    app = Celery("fusefleet", broker=settings.celery_broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        event_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_time_limit=settings.batch_time_limit_s,
        task_soft_time_limit=settings.soft_time_limit_s,
        task_default_queue=settings.queue_name,
        task_routes={RUN_BATCH_TASK: {"queue": settings.queue_name}},
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        # A broker drop does not kill the running batch (that would cost a model reload): its results are
        # fenced by the claim token, so a redelivered copy cannot double-write (docs/reliability.md).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # The pool process loads the model before it reports up; Celery's 4 s default would kill it in a loop.
        worker_proc_alive_timeout=settings.worker_start_timeout_s,
        broker_connection_max_retries=None,  # ride out any broker outage; never exit for want of a broker
        broker_connection_timeout=CONNECT_TIMEOUT_S,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        **transport.conf(settings),
    )
    return app
