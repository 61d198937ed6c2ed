"""The scheduler process: ``fusefleet scheduler`` calls ``run_scheduler``.

One process runs three loops until it is told to stop: the batching scheduler (``service_for(settings)``: one active
per fleet, holding the lease, the others standing by), the result sweeper (``ResultSweeper``, a thread; any number
may run) and the webhook dispatcher (``WebhookDispatcher``, a thread; one active per fleet). The flow is in
docs/architecture.md, the webhooks in docs/operations.md.
"""

from __future__ import annotations

import signal
import threading

from scheduler.lease import Lease
from scheduler.step_service import service_for
from scheduler.store import SchedulerStore
from scheduler.sweeper import ResultSweeper
from scheduler.webhooks import WebhookDispatcher
from shared.celery_config import make_celery
from shared.redis_conn import sync_client
from shared.results import ResultJournal, build_result_store
from shared.settings import Settings

WEBHOOKS_JOIN_S = 5.0
"""How long a stopping process waits for its webhook dispatcher, which gives its lease up within
``scheduler_block_ms``; past it the lease lapses."""


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (call from the main thread)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_scheduler(settings: Settings, stop: threading.Event | None = None) -> None:
    """Run the scheduler, the result sweeper and the webhook dispatcher in the foreground until ``stop`` is set
    (by default: until SIGTERM or SIGINT)."""
    stop = stop if stop is not None else stop_on_signals()
    client = sync_client(settings)
    store = SchedulerStore(client, settings)
    lease = Lease(client, store.keys.scheduler_lease, settings.scheduler_lease_ms)
    service = service_for(settings)(settings, store, lease, make_celery(settings))
    results = build_result_store(settings, sync_client(settings, binary=True))
    sweeper = ResultSweeper(ResultJournal(client, store.keys), results, interval_s=settings.result_sweep_interval_s)
    sweeper.start(stop)
    webhooks = WebhookDispatcher(sync_client(settings), settings).start(stop)
    service.run(stop)
    webhooks.join(timeout=WEBHOOKS_JOIN_S)
