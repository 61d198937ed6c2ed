"""The next batch message waiting in a worker's queues, taken straight from the broker (not through Celery's consumer).

The worker's lookahead (``gpu_worker.lookahead``) uses it while a forward runs: the pool process's own broker
connection (``Celery.connection_for_read``: the fleet's broker, Redis or RabbitMQ, with its transport options) gets
one message at a time (``kombu.Queue.get``, each queue of the worker in turn; on Redis one ``RPOP`` a queue,
``REDIS_OPTIONS``). Celery's consumer in the parent process fetches nothing meanwhile: the task that runs the chain
is not acknowledged yet (prefetch 1, late acks).

A message is acknowledged as soon as it is read: from then on the batch's record in Redis is what recovers it (the
claim's lock, or, unclaimed, the reaper's lost-message rule). A message this reader should not run ahead of (another
task, or a retry whose ``eta`` is still to come) goes back to its queue, unacknowledged, and ends the look
(``Miss.STOP``): Celery's consumer takes it once the chain ends. A broker error ends the look too, and the connection
is opened again at the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from kombu.entity import Queue as _Queue

from gpu_worker.lookahead import Miss
from shared.celery_config import RUN_BATCH_TASK

log = logging.getLogger(__name__)

KombuQueue: Any = _Queue  # kombu has no type hints

REDIS_OPTIONS: dict[str, Any] = {"priority_steps": [0]}
"""On a Redis broker, one look is one ``RPOP`` of the queue's list: fusefleet publishes no priorities, so every batch
message is in the list of priority 0 (kombu would look at four by default); one published with a priority would only
be left to Celery's consumer."""


def due(eta: str | None, now: datetime | None = None) -> bool:
    """Whether a task message with this ``eta`` header (ISO 8601, None for none) may run now."""
    if not eta:
        return True
    at = datetime.fromisoformat(eta)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at <= (now or datetime.now(UTC))


class QueueReader:
    """Takes the next ``fusefleet.run_batch`` message from ``queues`` (in order), for one thread."""

    def __init__(self, app: Celery, queues: Sequence[str], transport_options: Mapping[str, Any] | None = None) -> None:
        """``transport_options``: over the app's broker transport options, for this reader's connection only
        (``REDIS_OPTIONS`` on a Redis broker)."""
        self._app = app
        self._names = tuple(queues)
        self._options = dict(transport_options or {})
        self._connection: Any = None  # a kombu Connection
        self._queues: list[Any] = []  # kombu Queues bound to its channel

    def take(self) -> tuple[dict[str, Any], str] | Miss:
        """The batch message (``BatchMessage`` as JSON) and the queue it came from, acknowledged; ``Miss.EMPTY`` when
        none waits; ``Miss.STOP`` when one that must not be run ahead waits, or the broker failed."""
        try:
            for queue in self._bound():
                message = queue.get(no_ack=False, accept=["json"])
                if message is None:
                    continue
                headers = message.headers or {}
                args = _batch_args(message.decode())
                if headers.get("task") != RUN_BATCH_TASK or not due(headers.get("eta")) or not args:
                    message.reject(requeue=True)  # Celery's consumer takes it once the chain ends
                    return Miss.STOP
                message.ack()
                return args[0], queue.name
            return Miss.EMPTY
        except Exception as exc:  # noqa: BLE001 - the broker failed: this look ends, the next connects again
            log.warning("looking ahead in %s failed: %s: %s", ", ".join(self._names), type(exc).__name__, exc)
            self.close()
            return Miss.STOP

    def close(self) -> None:
        """Close the connection (the next ``take`` opens another)."""
        connection, self._connection, self._queues = self._connection, None, []
        if connection is not None:
            try:
                connection.release()
            except Exception as exc:  # noqa: BLE001 - a broken connection: nothing left to release
                log.debug("closing the lookahead's broker connection: %s", exc)

    def _bound(self) -> list[Any]:
        if self._connection is None:
            self._connection = self._app.connection_for_read(transport_options=self._options)
            channel = self._connection.default_channel
            self._queues = [KombuQueue(name).bind(channel) for name in self._names]
        return self._queues


def _batch_args(body: Any) -> list[Any]:
    """The positional arguments of a Celery protocol 2 body (``[args, kwargs, embed]``) when they are one batch
    message (a dict), else an empty list."""
    if isinstance(body, list | tuple) and body and isinstance(body[0], list | tuple) and len(body[0]) == 1:
        args = list(body[0])
        return args if isinstance(args[0], dict) else []
    return []
