"""Which Celery queue a model's batches take: the scheduler publishes each batch to its model's queue and a worker
consumes only the queues of the models it serves (``docs/architecture.md#routing-by-model``).

The fleet's default model keeps the fleet's queue (``queue_name``), so a fleet of one model routes exactly as it did
before several models; every other model ``m`` has ``<queue_name>.<m>`` (model names are safe in a queue name on
Redis and AMQP alike: ``shared.settings.model.MODEL_NAME``).
"""

from __future__ import annotations

from shared.settings import Settings


def model_queue(settings: Settings, model: str) -> str:
    """The Celery queue of ``model``'s batches in the fleet of ``settings``."""
    return settings.queue_name if model == settings.model_id else f"{settings.queue_name}.{model}"


def served_queues(settings: Settings) -> tuple[str, ...]:
    """The queues a worker of ``settings`` consumes: one per model it serves."""
    return tuple(model_queue(settings, model) for model in settings.served_models)
