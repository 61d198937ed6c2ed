"""A worker's next batch taken and claimed while its current forward runs, so the next forward starts at once.

Without it, the accelerator waits between two forwards for the worker's whole hand-off: the finished task's
acknowledgement, Celery's fetch of the next message (which the scheduler's prefetch published while the forward ran,
``scheduler.capacity``) and its dispatch to the pool process, then the claim (``claim.lua``), the specs, the inputs
and the journal: 20-30 ms on a loaded 2-core VM (docs/benchmarks.md, ``gap_ms``). With it (``worker_lookahead_s``
above 0, a worker of a one-model fleet in request-level mode), while a forward runs, one thread of the pool process
takes the next message straight from the worker's queues (``gpu_worker.queue_reader``), claims the batch and makes
it ready (``BatchExecutor.claim_ahead``), and the task that ran the current batch runs that one as soon as the
current forward is over, in the same process (``gpu_worker.app``): the Celery hand-off happens once per chain, not
once per batch.

When (``take_now``): once the current forward's end, estimated from its steps so far, is within ``lead_s``
(``worker_lookahead_s``), never before its first step (a runner that reports no step is never looked ahead of). So a
busy worker holds a batch an idle one could run for about ``lead_s`` at most (plus the estimate's error); until then
the batch waits in the shared queue, where an idle worker (blocked on it) or one that joins takes it first. If
nothing waits, it looks again every ``poll_every_s`` until the forward ends: at most ``lead_s / poll_every_s + 1``
looks per forward.

How long (``chain_open``): the chain runs inside one Celery task, under its time limits, and a warm shutdown waits
for it; it takes no next batch once the chain plus another batch as long as the current one would pass
``CHAIN_S`` (or half the soft time limit), so the task ends and Celery's hand-off takes the next one; and it starts
none it took past that bound (``chain_may_start``: the batch before ran far past its estimate), giving it back
instead. Only a batch's last planned forward is looked ahead of (the executor's ``ForwardWatch``), so a batch taken
waits for one forward's end, not for the forwards left after it.

Faults: a pre-claimed batch is claimed, locked and held by the heartbeat like a running one, so a worker that dies
holding it loses it exactly as a running batch (its lock lapses, the reaper publishes it again; its writes are fenced
by its claim token); one taken from the queue and not yet claimed is a lost message (the reaper publishes it again
after ``batch_claim_timeout_s``). A chain that stops on an error (or the soft limit, or a retry) gives its
pre-claimed batch back uncounted (``give_back.lua``), one still being taken too once its take returns.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

CHAIN_S = 10.0
"""The longest chain of batches one task runs before it lets Celery hand the next one over: bounds how long a warm
shutdown waits beyond the running batch, and keeps the task far inside its time limits."""

POLL_EVERY_S = 0.02
"""How often the lookahead looks again at an empty queue while the current forward's end is within the lead."""


class Miss(enum.Enum):
    """What a look at the queue found instead of a batch."""

    EMPTY = "nothing waits: look again"
    STOP = "look no more for this forward"


def take_now(step: int, total: int, elapsed_s: float, lead_s: float) -> bool:
    """Whether to take the next batch now: the forward at ``step`` of ``total``, ``elapsed_s`` after it began, is
    estimated (at the pace of its steps so far) to end within ``lead_s``. Never before its first step."""
    if step <= 0 or total <= 0:
        return False
    remaining_s = elapsed_s / step * max(0, total - step)
    return remaining_s <= lead_s


def chain_open(chain_s: float, batch_s: float, soft_limit_s: float) -> bool:
    """Whether a chain that has run ``chain_s`` (from its task's start) may take one more batch, which is assumed to
    take as long as the current one so far (``batch_s``): it must end within ``CHAIN_S`` and half the soft limit."""
    return chain_s + batch_s <= min(CHAIN_S, soft_limit_s / 2)


def chain_may_start(chain_s: float, soft_limit_s: float, lead_s: float) -> bool:
    """Whether a batch taken ahead may start ``chain_s`` after its chain's task began: within ``CHAIN_S`` and half
    the soft limit, as ``chain_open`` planned when it was taken, plus the lead (``lead_s``: the forward it was taken
    ahead of had that long left, by its estimate). Past it (the batch before ran far past its estimate: forwards
    left after the one looked ahead of, a forward that stalled, the soft limit met) it is given back uncounted
    instead, so every batch of a chain starts at most that long after its task did (a warm shutdown waits that plus
    one batch), with the rest of the soft limit before it."""
    return chain_s <= min(CHAIN_S, soft_limit_s / 2) + lead_s


class Lookahead(Generic[T]):
    """One thread that, while a batch's forwards run, calls ``take`` to obtain the next batch (a ``T``) or learn that
    none waits (``Miss``); the batch's runner says when (``forward_started``, ``step``), the task that runs the batch
    arms it before (``arm``) and collects what it took after (``collect``). ``take`` runs on the lookahead's thread
    only; one that raises is logged and ends the look for that batch. What it took and nobody collected within
    ``stale_after_s`` (the forward it was taken ahead of stalled: it could not start within the chain's bound
    anyway, ``chain_may_start``) is handed to ``on_stale`` (the worker gives it back uncounted, so another worker
    runs it instead of it waiting for the stalled forward, up to the hard time limit)."""

    def __init__(
        self,
        take: Callable[[], T | Miss],
        lead_s: float,
        *,
        poll_every_s: float = POLL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        name: str = "batch-lookahead",
        on_stale: Callable[[T], None] | None = None,
        stale_after_s: float = CHAIN_S,
    ) -> None:
        self._take = take
        self._on_stale = on_stale
        self._stale_after_s = stale_after_s
        self._lead_s = lead_s
        self._poll_every_s = poll_every_s
        self._clock = clock
        self._cond = threading.Condition()
        self._armed = False  # this batch may take its next one
        self._due = False  # the lead point is reached: look now (and again until the forward ends)
        self._busy = False  # a take runs
        self._taken: T | None = None
        self._forward_at = 0.0
        self._closed = False
        self.looks = 0
        """How many times ``take`` was called (for the tests and the logs)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """A batch's forwards are about to run: look ahead of them."""
        with self._cond:
            self._armed, self._due, self._taken = True, False, None

    def forward_started(self) -> None:
        """A forward begins (its steps are timed from now)."""
        with self._cond:
            self._forward_at = self._clock()

    def step(self, step: int, total: int) -> None:
        """The running forward reached ``step`` of ``total`` (the runner's thread: returns at once)."""
        with self._cond:
            if not self._armed or self._due or self._taken is not None:
                return
            if take_now(step, total, self._clock() - self._forward_at, self._lead_s):
                self._due = True
                self._cond.notify_all()

    def collect(self) -> T | None:
        """The batch's forwards are over: look no more, wait for a take in progress, and return what was taken."""
        with self._cond:
            self._armed = self._due = False
            self._cond.wait_for(lambda: not self._busy)
            taken, self._taken = self._taken, None
            self._cond.notify_all()  # collected: no longer stale
            return taken

    def close(self) -> None:
        """Stop the thread (after a take in progress)."""
        with self._cond:
            self._closed, self._armed = True, False
            self._cond.notify_all()
        self._thread.join(5.0)

    def _collected(self, taken: object) -> bool:
        """Whether ``taken`` was collected (or the lookahead closed): under ``_cond``."""
        return self._closed or self._taken is not taken

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._armed and self._due))
                if self._closed:
                    return
                self._busy = True
                self.looks += 1
            found: T | Miss = Miss.STOP
            try:
                found = self._take()
            except Exception:  # noqa: BLE001 - the thread must outlive one look's failure
                log.exception("looking ahead for the next batch failed")
            with self._cond:
                self._busy = False
                if found is Miss.EMPTY:
                    if self._armed:  # look again soon, unless the forward ends first (collect)
                        self._cond.wait_for(lambda: self._closed or not self._armed, self._poll_every_s)
                elif found is Miss.STOP:
                    self._due = False
                    self._armed = False
                else:
                    self._taken = found
                    self._due = False
                self._cond.notify_all()
                if found is Miss.EMPTY or found is Miss.STOP or self._on_stale is None:
                    continue
                if self._cond.wait_for(partial(self._collected, found), self._stale_after_s):
                    continue
                self._taken, self._armed = None, False  # stale: collect finds nothing, and looks no more
            log.warning("the batch taken ahead waited %.1f s for the forward running: handed back", self._stale_after_s)
            try:
                self._on_stale(found)
            except Exception:  # noqa: BLE001 - the thread must outlive it (its lock then lapses for the reaper)
                log.exception("handing back a batch taken ahead failed")
