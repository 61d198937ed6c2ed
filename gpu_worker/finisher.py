"""Where a batch's bookkeeping after its forward runs: inline, or behind the next forward.

After a forward, a batch's outputs still have to be encoded (PNG, JPEG, WebP, MP4), written to the result store,
and its requests finished in Redis: on a GPU that is a few hundred milliseconds of CPU and network per batch, time
the accelerator would otherwise sit idle. ``BackgroundFinisher`` runs that work on one thread while the worker's
next batch is already running its forward (encoding releases the GIL in Pillow and PyAV; result-store and Redis
writes wait on the network), so the accelerator never waits on bookkeeping.

Bounds: at most one batch is finished at a time and ``submit`` waits for it, so at most two batches' outputs are in
memory (the one being finished, the one whose forward just ended). Every call a finish makes is bounded (result
stores: ``result_store_timeout_s``, ``shared.results.deadline``; Redis: its socket timeouts and
``redis_outage_retry_s``). A finish that cannot go on because a call did not return (``FinisherStuck``: a result
store that hangs), or that still runs ``stuck_after_s`` after it began (whatever holds it), makes the finisher
stuck: it calls ``on_stuck`` once and refuses every later job, so the worker takes no more batches behind it. The
worker's ``on_stuck`` (``gpu_worker.app``'s retire) quarantines the worker, gives its batches back uncounted (the
reaper runs them again elsewhere; ``Heartbeat.withdraw``) and exits the pool process, which Celery replaces.
``close`` waits for the finish in progress at shutdown.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

Job = Callable[[], None]


class FinisherStuck(BaseException):
    """A finishing job cannot go on: a call it made did not return (a result store that hangs, its thread still in
    it), or the finisher is stuck and takes no more jobs. Not the requests' fault, so no handler that fails requests
    (``except Exception``) catches it: their batches are left to the reaper, and the worker is replaced."""


class Finisher(Protocol):
    """Runs each batch's finishing job, in submission order."""

    def submit(self, job: Job) -> None:
        """Hand over ``job``; may wait until the finisher can take it."""

    def close(self, timeout_s: float) -> bool:
        """Finish what was submitted (within ``timeout_s``) and stop; False when something was left unfinished."""


class InlineFinisher:
    """Runs each job at once, in the caller's thread, and lets its exceptions through (tests, simple runners)."""

    def submit(self, job: Job) -> None:
        job()

    def close(self, timeout_s: float) -> bool:
        return True


class BackgroundFinisher:
    """One daemon thread that runs one job at a time; ``submit`` waits while a job runs, so a forward overlaps at
    most one finish. A job's exception is logged; the job itself must leave its requests in a terminal state or to
    the reaper (``BatchExecutor`` does). A job that raises ``FinisherStuck``, or still runs ``stuck_after_s`` after
    it began, makes the finisher stuck (see the module's docstring): ``on_stuck(reason)`` is called once, and
    ``submit`` raises ``FinisherStuck`` from then on."""

    def __init__(
        self,
        name: str = "batch-finisher",
        *,
        stuck_after_s: float = math.inf,
        on_stuck: Callable[[str], None] | None = None,
    ) -> None:
        self._ready = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._closed = False
        self._started = 0.0  # monotonic start of the running job
        self._stuck_after_s = stuck_after_s
        self._on_stuck = on_stuck
        self.stuck: str | None = None
        """Why the finisher is stuck, once it is."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._ready:
            while self.stuck is None:
                if self._closed:
                    raise RuntimeError("the finisher is closed")
                if self._job is None and not self._busy:
                    self._job = job
                    self._ready.notify_all()
                    return
                overdue = self._busy and time.monotonic() - self._started >= self._stuck_after_s
                if overdue:
                    self._mark_stuck(f"a batch's finish still runs {self._stuck_after_s:g} s after it began")
                    break
                bounded = self._busy and math.isfinite(self._stuck_after_s)
                wait_s = self._started + self._stuck_after_s - time.monotonic() if bounded else None
                self._ready.wait(wait_s)
            reason = self.stuck
        self._call_on_stuck(reason)
        raise FinisherStuck(f"the finisher is stuck: {reason}")

    def idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no job is pending or running; False on timeout."""
        with self._ready:
            return self._ready.wait_for(lambda: self._job is None and not self._busy, timeout_s)

    def close(self, timeout_s: float) -> bool:
        finished = self.idle(timeout_s)
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        if finished:
            self._thread.join(timeout_s)
        return finished

    def _mark_stuck(self, reason: str) -> None:
        """Record why (under ``_ready``); the first reason stays."""
        if self.stuck is None:
            self.stuck = reason
            log.critical("the batch finisher is stuck (%s): this worker takes no more batches", reason)
            self._ready.notify_all()

    def _call_on_stuck(self, reason: str | None) -> None:
        with self._ready:
            on_stuck, self._on_stuck = self._on_stuck, None  # once
        if on_stuck is not None:
            on_stuck(reason or "stuck")

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job, self._busy = self._job, None, True
                self._started = time.monotonic()
                self._ready.notify_all()  # a waiting submit now waits at most until the job's bound
            try:
                job()
            except FinisherStuck as exc:
                with self._ready:
                    self._mark_stuck(str(exc))
                    reason = self.stuck
                self._call_on_stuck(reason)
                return  # the thread takes no more jobs
            except Exception:  # noqa: BLE001 - the thread must outlive one job's failure
                log.exception("finishing a batch failed")
            finally:
                with self._ready:
                    self._busy = False
                    self._ready.notify_all()
