"""Wiring: how the services of a fleet reach Redis and each other (its URL and timeouts, the key prefix, the Celery
queue) and how they log."""

from __future__ import annotations

from typing import Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from shared.logging_setup import LogFormat
from shared.settings.concern import SettingsConcern


class WiringSettings(SettingsConcern):
    """Redis, the key prefix and queue of the fleet, the log format."""

    section = "Wiring: Redis, key prefix, queue, logs"

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis (or Valkey) holding the request stream, request state and images, and the Celery broker unless broker_url
    is set."""

    redis_cluster: bool = False
    """redis_url is a seed node of a Redis Cluster: every service uses the cluster client, each fleet's keys share one
    hash slot per shard, and the Celery broker must be its own (broker_url). Off: one Redis (or Valkey), as before."""

    broker_url: str | None = None
    """Celery broker the scheduler publishes batches to and workers consume from: a Redis URL (redis://) or RabbitMQ
    (amqp://). Unset = redis_url; required when redis_cluster is on (Celery's Redis transport has no cluster
    support)."""

    redis_max_connections: int = Field(64, ge=2)
    """Redis connections of one API process; more concurrent calls wait for a free one (not an error)."""

    redis_socket_timeout_s: float = Field(10.0, gt=0, le=300)
    """Longest wait for one Redis reply: a stalled Redis turns into an error (api: 503 with Retry-After) after this long
    instead of a hang. Must exceed scheduler_block_ms."""

    redis_outage_retry_s: float = Field(60.0, ge=0)
    """How long a worker keeps retrying to store a finished batch's results while Redis is unreachable; past it the
    batch is left to the scheduler's reaper, which publishes it again."""

    key_prefix: str = "fusefleet"
    """Prefix of every Redis key fusefleet writes, and of its Celery queue (queue_name): fleets with distinct prefixes
    can share one Redis."""

    queue_name: str = Field("", validate_default=True)
    """Celery queue the scheduler publishes batches to and the workers take them from; unset or empty = key_prefix +
    '.batches' (fusefleet.batches), so each fleet on a shared Redis has its own. If set, set the same on every service
    of the fleet."""

    log_format: LogFormat = "text"
    """Log lines of every service: 'text' (time level logger: message [ids]) or 'json' (one object a line: time, level,
    logger, message, and service, worker, batch_id, request_id where known)."""

    @field_validator("queue_name", mode="after")
    @classmethod
    def _queue_follows_prefix(cls, value: str, info: ValidationInfo) -> str:
        """Unset: the fleet's own queue, after its key prefix (two fleets on one Redis never take each other's
        batches)."""
        return value or f"{info.data.get('key_prefix', 'fusefleet')}.batches"

    @model_validator(mode="after")
    def _cluster_has_its_own_broker(self) -> Self:
        if self.redis_cluster and not self.broker_url:
            raise ValueError(
                "broker_url must be set when redis_cluster is on: Celery's Redis transport cannot use a Redis Cluster "
                "(use a plain Redis or RabbitMQ, amqp://)"
            )
        return self

    @property
    def celery_broker_url(self) -> str:
        """The Celery broker's URL: ``broker_url``, else the fleet's Redis."""
        return self.broker_url or self.redis_url
