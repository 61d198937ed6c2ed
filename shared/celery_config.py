"""The Celery application both sides agree on: JSON only, late acks, one batch at a time per worker process.

The scheduler only publishes (by task name); the worker registers the task on the same configuration.
"""

from __future__ import annotations

from celery import Celery

from shared.redis_conn import CONNECT_TIMEOUT_S
from shared.settings import Settings

RUN_BATCH_TASK = "fusefleet.run_batch"


def make_celery(settings: Settings) -> Celery:
    """A Celery app bound to the fleet's Redis, configured for long, exclusive GPU tasks."""
    app = Celery("fusefleet", broker=settings.celery_broker_url, set_as_current=False)
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        # kombu's Redis transport has no socket timeouts by default: a Redis that stops answering without
        # closing TCP would block a publish (the scheduler's dispatch, lease renewal and reaper) forever.
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
    }
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
        broker_connection_max_retries=None,  # ride out any Redis outage; never exit for want of a broker
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        visibility_timeout=settings.visibility_timeout_s,
    )
    return app
