"""A worker process's background beat: announce the slot, keep the running batch's lock alive."""

from __future__ import annotations

import logging
import threading

from gpu_worker.store import WorkerStore
from shared.contracts import WorkerCapabilities

log = logging.getLogger(__name__)


class Heartbeat:
    """Daemon thread beating every ``interval_s`` until ``stop()``.

    While a batch runs, ``hold(batch_id, token)`` makes each beat renew that batch's lock, so a crashed worker's
    batch becomes claimable again within ``batch_lock_ttl_s`` while a slow, live one keeps it.
    """

    def __init__(
        self, store: WorkerStore, worker: str, interval_s: float, capabilities: WorkerCapabilities
    ) -> None:
        self._store = store
        self._worker = worker
        self._capabilities = capabilities
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._held: tuple[str, str] | None = None
        self._announced = False  # the first successful beat also wakes the scheduler
        self._thread = threading.Thread(target=self._loop, name="fusefleet-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat once now (announcing the slot) and then every ``interval_s``; a Redis outage only delays it."""
        self._beat()
        self._thread.start()

    def hold(self, batch_id: str, token: str) -> None:
        self._held = (batch_id, token)

    def release(self) -> None:
        self._held = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval_s * 2)
        try:
            self._store.leave(self._worker)
        except Exception as exc:  # noqa: BLE001 - the entry then expires after worker_ttl_s
            log.warning("could not withdraw the worker slot: %s", exc)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._beat()

    def _beat(self) -> None:
        try:
            self._store.heartbeat(self._worker, self._capabilities, first=not self._announced)
            self._announced = True
            held = self._held
            if held is not None and not self._store.renew_lock(*held):
                log.warning("lost the lock of batch %s: another run may claim it (late writes are ignored)", held[0])
        except Exception as exc:  # noqa: BLE001 - a Redis blip must not kill the beat; the next one retries
            log.warning("heartbeat failed: %s", exc)
