"""Progress and abort signals of one forward, off the denoising loop.

The step callback only records the step and returns what is known of the rows (``RowSignal``): it never waits on
Redis. A thread writes the latest step (``progress.lua``, one round trip for the whole forward) at most once per
``WRITE_EVERY_S``, the first one interval into the forward (so a forward shorter than that writes only its last
step), and keeps the signals that write answers: aborted rows, and rows another
run claimed since (a stalled worker replaced after its lock lapsed). The forward stops at the step after every row
is known to be aborted or not ours, so an abort reaches the loop within ``WRITE_EVERY_S`` plus one Redis round trip
plus one step, and a slow or stalled Redis slows nothing but the reports. While Redis fails, reports pause for
``PAUSE_S`` and the forward goes on. ``close`` writes the final step at once (so a finished request shows
``step == total``) and stops the thread, within ``CLOSE_TIMEOUT_S``; ``close_unwritten`` leaves that write to the
requests' ending (``finish.lua`` writes the step with their status).

``on_aborted``, when given, is called on the reporter's thread (never the loop's) with the requests a write just
found aborted, once per request, so their owner can end them at once while the forward still runs (the request-level
executor ends them ``aborted``, ``gpu_worker.executor``). A call that raises a Redis outage is retried with the next
write that still finds the request aborted; any other error is logged and not retried (the owner finds the row's
``ABORTED`` signal after the forward).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gpu_worker.store import RowSignal, WorkerStore
from shared.retry import TRANSIENT_ERRORS

log = logging.getLogger(__name__)

PAUSE_S = 1.0  # after a failed write, skip writes this long (Redis is away)
WRITE_EVERY_S = 0.25  # at most one progress write per forward this often: SSE events are throttled to it anyway
CLOSE_TIMEOUT_S = 2.0  # the longest close waits for the final write


class StepReporter:
    """Reports one forward's steps for the requests ``request_ids`` of the claim ``token``."""

    def __init__(
        self,
        store: WorkerStore,
        request_ids: Sequence[str],
        token: str,
        *,
        on_aborted: Callable[[list[str]], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """``on_progress(step, total)``: called on the runner's thread with each step, before ``on_step`` returns
        (it must return at once: the worker's lookahead, ``gpu_worker.lookahead``)."""
        self._store = store
        self._ids = list(request_ids)
        self._token = token
        self._on_aborted = on_aborted
        self._on_progress = on_progress
        self._handed: set[str] = set()  # requests handed to on_aborted (reporter thread only)
        self._lock = threading.Lock()
        self._pending: tuple[int, int] | None = None
        self._latest: tuple[int, int] | None = None  # the last step reported, written or not
        self._leave_last = False  # close_unwritten: the caller writes the last step
        self._last_step = 0
        self._signals = [RowSignal.GO_ON] * len(self._ids)
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-reporter", daemon=True)
        self._thread.start()

    def on_step(self, step: int, total: int) -> bool:
        """The runner's step callback: record the step, and whether to stop (every row aborted or not ours)."""
        with self._lock:
            self._pending = self._latest = (step, total)
            self._last_step = max(self._last_step, step)
            stop = all(signal is not RowSignal.GO_ON for signal in self._signals)
        self._wake.set()
        if self._on_progress is not None:
            self._on_progress(step, total)
        return stop

    @property
    def last_step(self) -> int:
        """The highest step the forward reported (0 when it reported none)."""
        with self._lock:
            return self._last_step

    @property
    def signals(self) -> list[RowSignal]:
        with self._lock:
            return list(self._signals)

    def close(self, *, wait: bool = True) -> None:
        """Write the last step not yet written, then stop the thread; ``wait``: until it has (bounded by
        ``CLOSE_TIMEOUT_S``), else return at once (a later ``close()`` waits)."""
        self._closed.set()
        self._wake.set()
        if wait:
            self._thread.join(CLOSE_TIMEOUT_S)

    def close_unwritten(self) -> tuple[int, int] | None:
        """Stop the thread without writing the last step (bounded by ``CLOSE_TIMEOUT_S``): the caller writes it
        with the requests' ending (``finish.lua``), so a forward that ran to its end costs no write of its own. The
        last (step, total) the forward reported, None when it reported none."""
        self._leave_last = True
        self.close()
        with self._lock:
            return self._latest

    def _run(self) -> None:
        self._closed.wait(WRITE_EVERY_S)  # the first write one interval in (close ends the wait: the last step)
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, None
            if pending is not None and not self._leave_last:
                started = time.monotonic()
                self._write(*pending)
                self._closed.wait(WRITE_EVERY_S - (time.monotonic() - started))  # close ends the wait
            if self._closed.is_set():
                with self._lock:
                    last = self._pending
                if last is not None and not self._leave_last:
                    self._write(*last)
                return

    def _write(self, step: int, total: int) -> None:
        try:
            signals = self._store.progress(self._ids, step, total, self._token)
        except TRANSIENT_ERRORS as exc:  # progress is best effort: the forward goes on through an outage
            log.warning("progress not recorded (%s); going on", exc)
            self._closed.wait(PAUSE_S)
            return
        except Exception:  # noqa: BLE001 - a reporting bug must not end the forward
            log.exception("progress write failed")
            return
        with self._lock:
            self._signals = signals
        if self._on_aborted is not None:
            self._hand_aborted(signals)

    def _hand_aborted(self, signals: Sequence[RowSignal]) -> None:
        """Call ``on_aborted`` with the requests newly found aborted (each once, unless it met an outage)."""
        assert self._on_aborted is not None
        aborted = [
            rid
            for rid, signal in zip(self._ids, signals, strict=True)
            if signal is RowSignal.ABORTED and rid not in self._handed
        ]
        if not aborted:
            return
        try:
            self._on_aborted(aborted)
        except TRANSIENT_ERRORS as exc:
            log.warning("aborted requests %s not ended yet (%s); trying again with the next report", aborted, exc)
            return
        except Exception:  # noqa: BLE001 - the owner ends them after the forward from their signals
            log.exception("ending aborted requests %s failed", aborted)
        self._handed.update(aborted)
