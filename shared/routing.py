"""Which Celery queue a batch takes: the scheduler publishes each batch to its model's queue, or to one worker's own
queue when it places the batch on a worker that holds its model resident (``scheduler.placement``); a worker
consumes the queues of the models it serves and, in a fleet of several models, its own
(``docs/architecture.md#routing-by-model``).

The fleet's default model keeps the fleet's queue (``queue_name``), so a fleet of one model routes exactly as it did
before several models; every other model ``m`` has ``<queue_name>.<m>`` (model names are safe in a queue name on
Redis and AMQP alike: ``shared.settings.model.MODEL_NAME``). Worker ``w``'s own queue is ``<queue_name>@<w>`` (no
model name holds an ``@``, so it never is a model's queue).
"""

from __future__ import annotations

from shared.settings import Settings


def model_queue(settings: Settings, model: str) -> str:
    """The Celery queue of ``model``'s batches in the fleet of ``settings``: any worker that serves it takes them."""
    return settings.queue_name if model == settings.model_id else f"{settings.queue_name}.{model}"


def worker_queue(settings: Settings, worker: str) -> str:
    """The Celery queue of the batches placed on ``worker`` (a worker name, as its heartbeat announces it)."""
    return f"{settings.queue_name}@{worker}"


def served_queues(settings: Settings, worker: str) -> tuple[str, ...]:
    """The queues worker ``worker`` of ``settings`` consumes: one per model it serves, then its own queue in a fleet
    of several models."""
    models = tuple(model_queue(settings, model) for model in settings.served_models)
    return (*models, worker_queue(settings, worker)) if len(settings.catalog) > 1 else models
