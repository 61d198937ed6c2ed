"""The scheduler process: ``fusefleet scheduler`` calls ``run_scheduler``.

For every shard of the fleet (``shared.shards``: one, the fleet's own keys, without ``model_shards``) one process runs
three loops over the shard's settings (``Shards.settings_of``) until it is told to stop: the batching scheduler
(``service_for(settings)``: one active per shard, holding its lease, the others standing by), the result sweeper
(``ResultSweeper``; any number may run) and the webhook dispatcher (``WebhookDispatcher``; one active per shard),
each in a thread of its own. In a fleet of several shards the processes spread the shards' leases between them
(``scheduler.shard_leaders``): N processes lead N shards at once. The flow is in docs/architecture.md, the webhooks in
docs/operations.md.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from scheduler.lease import Lease
from scheduler.shard_leaders import ShardLeaders
from scheduler.step_service import service_for
from scheduler.store import SchedulerStore
from scheduler.sweeper import ResultSweeper
from scheduler.webhooks import WebhookDispatcher
from shared.celery_config import make_celery
from shared.redis_conn import sync_client
from shared.results import ResultJournal, build_result_store
from shared.settings import Settings
from shared.shards import Shards

log = logging.getLogger(__name__)

WEBHOOKS_JOIN_S = 5.0
"""How long a stopping process waits for its webhook dispatchers, which give their leases up within
``scheduler_block_ms``; past it the leases lapse."""
WATCH_S = 1.0
"""How often the main thread looks whether a shard's batching service thread ended unasked."""


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (call from the main thread)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@dataclass(frozen=True)
class ProcessClients:
    """The Redis clients of one scheduler process, which every shard's threads share: a fleet's shards are key
    prefixes of one Redis (or one Redis Cluster), so one connection pool of each kind serves them all (not three
    per shard)."""

    text: redis.Redis
    binary: redis.Redis

    @classmethod
    def of(cls, settings: Settings) -> ProcessClients:
        return cls(sync_client(settings), sync_client(settings, binary=True))


@dataclass(frozen=True)
class ShardScheduler:
    """What a scheduler process runs for one shard, over ``settings`` (the shard's, ``Shards.settings_of``):
    ``wanted`` and ``token`` are the spread's (``ShardLeaders``; None: a fleet of one shard, always contend with a
    fresh token), ``shard`` names it in the log lines."""

    settings: Settings
    shard: str = ""
    wanted: Callable[[], bool] | None = None
    token: str | None = None
    clients: ProcessClients | None = field(default=None, compare=False)  # None: its own

    def start(self, stop: threading.Event) -> tuple[threading.Thread, threading.Thread]:
        """Start the sweeper, the webhook dispatcher and the batching service, each a thread; returns the service's
        thread and the dispatcher's."""
        settings = self.settings
        where = f" [{self.shard}]" if self.shard else ""
        clients = self.clients or ProcessClients.of(settings)
        client = clients.text
        store = SchedulerStore(client, settings)
        lease = Lease(client, store.keys.scheduler_lease, settings.scheduler_lease_ms, token=self.token)
        service = service_for(settings)(
            settings, store, lease, make_celery(settings), wanted=self.wanted, name=f"scheduler{where}"
        )
        results = build_result_store(settings, clients.binary)
        journal = ResultJournal(client, store.keys)
        ResultSweeper(journal, results, interval_s=settings.result_sweep_interval_s).start(stop)
        dispatcher = WebhookDispatcher(client, settings, wanted=self.wanted, name=f"webhook dispatcher{where}")
        webhooks = dispatcher.start(stop)
        thread = threading.Thread(target=service.run, args=(stop,), name=f"scheduler{where}", daemon=True)
        thread.start()
        return thread, webhooks


def run_scheduler(settings: Settings, stop: threading.Event | None = None) -> None:
    """Run every shard's scheduler, result sweeper and webhook dispatcher in the foreground until ``stop`` is set (by
    default: until SIGTERM or SIGINT); in a fleet of several shards, spread with the other scheduler processes
    (``ShardLeaders``). Raises SystemExit(1) when a shard's service thread ended unasked (the process must not stay
    up leading some shards and announcing itself for all)."""
    stop = stop if stop is not None else stop_on_signals()
    shards = Shards(settings)
    clients = ProcessClients.of(settings)
    leaders: ShardLeaders | None = None
    spreading: threading.Thread | None = None
    if len(shards.names) > 1:
        leaders = ShardLeaders(clients.text, settings)
        spreading = leaders.start(stop)
    started = [
        ShardScheduler(
            shards.settings_of(shard),
            shard,
            wanted=leaders.wanted_of(shard) if leaders is not None else None,
            token=leaders.token if leaders is not None else None,
            clients=clients,
        ).start(stop)
        for shard in shards.names
    ]
    services = [service for service, _ in started]
    crashed = False
    while not stop.wait(WATCH_S):
        ended = [thread.name for thread in services if not thread.is_alive()]
        if ended:
            log.critical("%s ended unasked; stopping this scheduler process", ", ".join(ended))
            crashed = True
            stop.set()
    for service in services:
        service.join()
    for _, webhooks in started:
        webhooks.join(timeout=WEBHOOKS_JOIN_S)
    if spreading is not None:  # it withdraws this process's announcement on its way out
        spreading.join(timeout=WEBHOOKS_JOIN_S)
    if crashed:
        raise SystemExit(1)
