"""Where a batch's bookkeeping after its forward runs: inline, or behind the next forward.

After a forward, a batch's outputs still have to be encoded (PNG, JPEG, WebP, MP4), written to the result store,
and its requests finished in Redis: on a GPU that is a few hundred milliseconds of CPU and network per batch, time
the accelerator would otherwise sit idle. ``BackgroundFinisher`` runs that work on one thread while the worker's
next batch is already running its forward (encoding releases the GIL in Pillow and PyAV; result-store and Redis
writes wait on the network), so the accelerator never waits on bookkeeping.

Bounds: at most one batch is finished at a time and ``submit`` waits for it, so at most two batches' outputs are in
memory (the one being finished, the one whose forward just ended). A finish that never ends (a result store that
never answers) cannot strand its requests: the heartbeat stops renewing a batch's lock ``batch_time_limit_s`` after
the claim (``gpu_worker.heartbeat``), the reaper runs the batch again elsewhere, and the late writer is fenced by its
claim token. ``close`` waits for the finish in progress at shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

Job = Callable[[], None]


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
    the reaper (``BatchExecutor`` does)."""

    def __init__(self, name: str = "batch-finisher") -> None:
        self._ready = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("the finisher is closed")
            self._ready.wait_for(lambda: self._job is None and not self._busy)
            self._job = job
            self._ready.notify_all()

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

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job, self._busy = self._job, None, True
            try:
                job()
            except Exception:  # noqa: BLE001 - the thread must outlive one job's failure
                log.exception("finishing a batch failed")
            finally:
                with self._ready:
                    self._busy = False
                    self._ready.notify_all()
