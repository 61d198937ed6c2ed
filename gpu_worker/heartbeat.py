"""A worker process's background beat: announce the slot, keep the running batch's lock alive."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpu_worker.log_context import ids
from gpu_worker.store import WorkerStore
from shared.contracts import WorkerCapabilities

log = logging.getLogger(__name__)


class Heartbeat:
    """Daemon thread beating every ``interval_s`` until ``stop()``.

    From ``hold(batch_id, token)`` to ``release(batch_id, token)`` each beat renews that batch's lock, so a crashed
    worker's batch becomes claimable again within ``batch_lock_ttl_s`` while a slow, live one keeps it. A worker
    holds two batches at once while one is finished behind the other's forward (``gpu_worker.finisher``). A hold
    ends by itself ``hold_limit_s`` after it began (``batch_time_limit_s``): a run stuck past it (a result store that
    never answers) lets its lock lapse, and the reaper runs the batch again.
    """

    def __init__(
        self,
        store: WorkerStore,
        worker: str,
        interval_s: float,
        capabilities: WorkerCapabilities,
        *,
        hold_limit_s: float = float("inf"),
    ) -> None:
        self._store = store
        self._worker = worker
        self._capabilities = capabilities
        self._interval_s = interval_s
        self._hold_limit_s = hold_limit_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], float] = {}  # (batch id, token) -> monotonic deadline
        self._announced = False  # the first successful beat also wakes the scheduler
        self._after_beat: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._loop, name="fusefleet-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat once now (announcing the slot) and then every ``interval_s``; a Redis outage only delays it."""
        self._beat()
        self._thread.start()

    def after_beat(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the beat's thread after each successful beat (repairs that wait for Redis to answer); an
        error it raises is logged, and it runs again at the next beat."""
        self._after_beat.append(task)

    def hold(self, batch_id: str, token: str) -> None:
        with self._lock:
            self._held[(batch_id, token)] = time.monotonic() + self._hold_limit_s

    def release(self, batch_id: str, token: str) -> None:
        with self._lock:
            self._held.pop((batch_id, token), None)

    @property
    def held(self) -> list[str]:
        """The batches whose locks the beat renews."""
        with self._lock:
            return [batch_id for batch_id, _ in self._held]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=self._interval_s * 2)
        try:
            self._store.leave(self._worker)
        except Exception as exc:  # noqa: BLE001 - the entry then expires after worker_ttl_s
            log.warning("could not withdraw the worker slot: %s", exc)

    def withdraw(self) -> None:
        """The worker gives up (its finisher is stuck): stop beating and withdraw the slot (the scheduler counts
        none for it), and release the lock of every batch it holds, so the reaper publishes them again at its next
        pass instead of ``batch_lock_ttl_s`` later. Best effort: what Redis refuses lapses by itself."""
        self.stop()
        with self._lock:
            held, self._held = list(self._held), {}
        for batch_id, token in held:
            try:
                self._store.release_lock(batch_id, token)
            except Exception as exc:  # noqa: BLE001 - the lock lapses within batch_lock_ttl_s
                log.warning("could not release batch %s: %s", batch_id, exc, extra=ids(batch_id=batch_id))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._beat()

    def _beat(self) -> None:
        try:
            self._store.heartbeat(self._worker, self._capabilities, first=not self._announced)
            self._announced = True
            now = time.monotonic()
            with self._lock:
                held = list(self._held.items())
            for (batch_id, token), deadline in held:
                if now > deadline:
                    log.error(
                        "batch %s held past batch_time_limit_s: its lock is left to lapse",
                        batch_id,
                        extra=ids(batch_id=batch_id),
                    )
                    self.release(batch_id, token)
                elif not self._store.renew_lock(batch_id, token):
                    log.warning(
                        "lost the lock of batch %s: another run may claim it (late writes ignored)",
                        batch_id,
                        extra=ids(batch_id=batch_id),
                    )
        except Exception as exc:  # noqa: BLE001 - a Redis blip must not kill the beat; the next one retries
            log.warning("heartbeat failed: %s", exc)
            return
        for task in self._after_beat:
            try:
                task()
            except Exception as exc:  # noqa: BLE001 - tried again at the next beat
                log.warning("after-beat task failed: %s", exc)
