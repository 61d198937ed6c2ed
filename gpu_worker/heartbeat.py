"""A worker process's background beat: announce the slot, keep the running batch's lock alive."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from gpu_worker.log_context import ids
from gpu_worker.store import Beat, WorkerStore
from shared.contracts import WorkerCapabilities

log = logging.getLogger(__name__)


class Heartbeat:
    """Daemon thread beating every ``interval_s`` until ``stop()``.

    From ``hold(batch_id, token)`` to ``release(batch_id, token)`` each beat renews that batch's lock, so a crashed
    worker's batch becomes claimable again within ``batch_lock_ttl_s`` while a slow, live one keeps it. A worker
    holds two batches at once while one is finished behind the other's forward (``gpu_worker.finisher``). A hold
    ends by itself ``hold_limit_s`` after it began (``batch_time_limit_s``): a run stuck past it (a result store that
    never answers) lets its lock lapse, and the reaper runs the batch again.

    A quarantined worker (``withdraw``) announces nothing: its beats are refused (``heartbeat.lua``) and
    ``quarantined`` is True until the quarantine ends; the first beat announced calls ``on_announce``. A later beat
    that finds the worker swept from the live ones (a beat came later than ``worker_ttl_s``) runs the tasks given to
    ``after_rejoin``.
    """

    LET_GO = 16
    """Holds ended lately that ``withdraw`` still gives back (token-guarded: a batch already done is left alone)."""

    def __init__(
        self,
        store: WorkerStore,
        worker: str,
        interval_s: float,
        capabilities: WorkerCapabilities,
        *,
        hold_limit_s: float = float("inf"),
        on_announce: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._worker = worker
        self._capabilities = capabilities
        self._interval_s = interval_s
        self._hold_limit_s = hold_limit_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], float] = {}  # (batch id, token) -> monotonic deadline
        self._let_go: deque[tuple[str, str]] = deque(maxlen=self.LET_GO)  # released holds, latest last
        self._announced = False  # the first announced beat also wakes the scheduler
        self._on_announce = on_announce
        self.quarantined = False
        """The last beat was refused: this worker is quarantined (no slot, no batch)."""
        self._after_beat: list[Callable[[], None]] = []
        self._after_rejoin: list[Callable[[], None]] = []
        self._rejoined = threading.Event()  # a beat announced the worker anew: run the rejoin tasks
        self._thread = threading.Thread(target=self._loop, name="fusefleet-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat once now (announcing the slot) and then every ``interval_s``; a Redis outage only delays it."""
        self._beat()
        self._thread.start()

    def update(self, capabilities: WorkerCapabilities) -> None:
        """Announce ``capabilities`` from now on (a model loaded or evicted); once started, announce them at once
        (best effort: the next beat does anyway) so the scheduler sees them before the next interval."""
        self._capabilities = capabilities
        if self._thread.is_alive() and self._announced:
            try:
                if self._store.heartbeat(self._worker, capabilities) == Beat.ANEW:
                    self._swept()  # the next beat runs the rejoin tasks
            except Exception as exc:  # noqa: BLE001 - the next beat announces them
                log.warning("could not announce the new capabilities now: %s", exc)

    def after_beat(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the beat's thread after each successful beat (repairs that wait for Redis to answer); an
        error it raises is logged, and it runs again at the next beat."""
        self._after_beat.append(task)

    def after_rejoin(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the beat's thread after a beat that announced the worker anew, having found it swept from
        the live workers with what it had registered (``free_slots.lua``); an error it raises is logged."""
        self._after_rejoin.append(task)

    def hold(self, batch_id: str, token: str) -> None:
        with self._lock:
            self._held[(batch_id, token)] = time.monotonic() + self._hold_limit_s

    def release(self, batch_id: str, token: str) -> None:
        """Stop renewing the batch's lock (it is done, or left to lapse)."""
        with self._lock:
            if self._held.pop((batch_id, token), None) is not None:
                self._let_go.append((batch_id, token))

    @property
    def held(self) -> list[str]:
        """The batches whose locks the beat renews."""
        with self._lock:
            return [batch_id for batch_id, _ in self._held]

    def stop(self) -> None:
        self._halt()
        try:
            self._store.leave(self._worker)
        except Exception as exc:  # noqa: BLE001 - the entry then expires after worker_ttl_s
            log.warning("could not withdraw the worker slot: %s", exc)

    def withdraw(self, reason: str) -> None:
        """The worker gives up (its finisher is stuck: its result store hangs): quarantine it (no slot, no beat
        announced, for ``worker_quarantine_s``), stop beating, and give every batch it holds (or let go of lately:
        the one whose write hung) back to the reaper uncounted (``WorkerStore.give_back``: no lost run, no split),
        so the reaper publishes them again at its next pass. Best effort: what Redis refuses lapses by itself
        within ``batch_lock_ttl_s`` (then counted as a lost run)."""
        try:
            self._store.quarantine(self._worker, reason)
        except Exception as exc:  # noqa: BLE001 - the slot then expires after worker_ttl_s
            log.warning("could not quarantine the worker: %s", exc)
        self._halt()
        with self._lock:
            held = [*self._let_go, *self._held]
            self._held, self._let_go = {}, deque(maxlen=self.LET_GO)
        for batch_id, token in held:
            try:
                given = self._store.give_back(batch_id, token)
            except Exception as exc:  # noqa: BLE001 - the lock lapses within batch_lock_ttl_s
                log.warning("could not give back batch %s: %s", batch_id, exc, extra=ids(batch_id=batch_id))
                continue
            if given >= 0:
                log.warning(
                    "batch %s given back (%d requests): another worker runs it",
                    batch_id,
                    given,
                    extra=ids(batch_id=batch_id),
                )

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=self._interval_s * 2)

    def _announce(self) -> None:
        if self._on_announce is not None:
            try:
                self._on_announce()
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("on_announce failed: %s", exc)

    def _swept(self) -> None:
        """A beat announced the worker anew after its first: it had been swept (``free_slots.lua``). The rejoin
        tasks run after this beat, on the beat's thread (after the next one when ``update``'s call found it so)."""
        log.warning("this worker was swept from the live workers (a beat came later than worker_ttl_s)")
        self._rejoined.set()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._beat()

    def _beat(self) -> None:
        try:
            first = not self._announced
            beat = self._store.heartbeat(self._worker, self._capabilities, first=first)
            announced = bool(beat)
            if beat == Beat.ANEW and not first:
                self._swept()
            self.quarantined = not announced
            if announced and first:
                self._announced = True
                self._announce()
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
        rejoin_tasks: list[Callable[[], None]] = []
        if self._rejoined.is_set():  # cleared before the tasks run: a later set() runs them at the next beat
            self._rejoined.clear()
            rejoin_tasks = self._after_rejoin
        for task in [*rejoin_tasks, *self._after_beat]:
            try:
                task()
            except Exception as exc:  # noqa: BLE001 - an after-beat task is tried again at the next beat
                log.warning("after-beat task failed: %s", exc)
