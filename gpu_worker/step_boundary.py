"""A running set's Redis round trips off its step boundaries: two threads that work while the next step computes
(docs/step_mode.md#the-fleet-in-step-mode, *Each step boundary*).

``Arrivals`` reads the worker's inbox ahead of the boundary: it waits on the inbox (``BLPOP``, ``POLL_S`` at a
time), and claims each batch the scheduler sent (``CLAIM`` under a claim token of its own), has the heartbeat hold
it, marks it ``FORWARD_DONE`` and journals its result keys, so that at the boundary the loop only takes what is
ready (``take``, no round trip) and joins it. A batch still being claimed at a boundary joins at the next one; an
eviction is handed over as it was read, in inbox order. Before the set may close, ``pause`` waits until no read is
in flight (at most ``POLL_S`` plus one claim) and ``drain`` reads the rest on the caller's thread, so nothing popped
from the inbox is left behind by ``step_close``.

After a beat found the worker swept from the live ones with its set's registration (a beat later than
``worker_ttl_s``, ``free_slots.lua``), ``reregister`` has the reader register the set again
(``step_reregister.lua``), between two reads: with ``SetCount``'s count plus the requests of the batches left in the
inbox, which while the set is not registered only this thread pops; under the set's id, so that a call that comes
after the set closed or was dropped writes nothing.

``Writes`` runs the set's bookkeeping writes in the order they were submitted, one at a time, on one thread: the
count-outs (``step_leave.lua``, whose token protects a retried call only while one count-out is in flight at a
time), the levels of joiners, the release of ended batches (``BATCH_DONE``). ``flush`` waits for them (before the
set closes); ``close`` flushes and makes later writes run on the caller's thread (the set's cleanup).

Errors: each Redis call is retried through an outage for ``redis_outage_retry_s`` (``ResultWriter.redis``); an
error that outlives it (or any other error) stops the thread, and the loop raises it at its next ``take``/``check``,
as if it had made the call itself: the set then fails or is left to the reaper as before. Every wait here is
bounded: ``pause`` and ``flush`` by ``timeout_s`` (the outage bound plus a margin), ``stop`` by ``STOP_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import ValidationError

from gpu_worker.heartbeat import Heartbeat
from gpu_worker.result_writer import ResultWriter
from gpu_worker.store import Claimed, Locked
from shared.compat import step_key
from shared.contracts import BatchMessage, StepEviction, Task
from shared.keys import STEP_SEALED

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How long one inbox read waits for a batch (``BLPOP``): the longest ``pause`` waits for a read in flight."""
STOP_TIMEOUT_S = 2.0
"""The longest ``stop`` waits for a thread to end (a daemon thread left past it ends with its call)."""
MARGIN_S = 5.0
"""Added to the outage bound for a wait on the other thread's calls."""
REREGISTER_RETRY_S = 1.0
"""How long after a try that could not register a swept set again the next one is made."""


@dataclass(frozen=True, slots=True)
class Joiner:
    """A batch sent to the set and claimed ahead of the boundary: held by the heartbeat, marked ``FORWARD_DONE``
    and its result keys journaled; its requests are still to join."""

    message: BatchMessage
    claim: Claimed


@dataclass(frozen=True, slots=True)
class Eviction:
    """The scheduler asked the set to evict ``request_id`` (``step_evict.lua``), for batch ``joiner`` where it sent
    one to take the room (``step_swap.lua``)."""

    request_id: str
    joiner: str | None = None


Arrival = Joiner | Eviction


class SetCount:
    """The requests a running set holds or was sent, as its worker knows them: those it opened with and those of
    each batch popped from its inbox, less those counted out (``step_leave.lua``) or requeued (``requeue.lua``)
    once that call returned. With the requests of the batches still in its inbox, never below what the set holds or
    will absorb (a count-out in flight is still counted): ``step_reregister.lua`` registers a swept set again with
    that sum. Thread-safe; ``opened`` names the set once it is registered (``step_open``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = 0
        self._set_id: str | None = None

    def open(self, rows: int, set_id: str) -> None:
        """The set ``set_id`` was registered with ``rows`` requests (``step_open``)."""
        with self._lock:
            self._rows += rows
            self._set_id = set_id

    def add(self, rows: int) -> None:
        with self._lock:
            self._rows += rows

    def subtract(self, rows: int) -> None:
        with self._lock:
            self._rows -= rows

    @property
    def opened(self) -> tuple[str, int] | None:
        """The set's id and count, or None before it was opened."""
        with self._lock:
            return None if self._set_id is None else (self._set_id, self._rows)


def _message(raw: str) -> BatchMessage | StepEviction | None:
    """What an inbox entry is: a batch sent to the set, an eviction, or None (unreadable)."""
    try:
        return BatchMessage.model_validate_json(raw)
    except ValidationError:
        try:
            return StepEviction.model_validate_json(raw)
        except ValidationError:
            return None


class Arrivals:
    """Reads and claims a worker's inbox on its own thread while the set steps (see the module's docstring).

    ``on_skipped(count)`` is called (on this thread) with the requests of a batch another run holds (``Locked``):
    the set will not run them, and the owner counts them out. ``count`` gains the requests of each batch popped;
    ``sealed()`` says whether the set is sealed or its seal is due (what a registration made again says)."""

    def __init__(
        self,
        writer: ResultWriter,
        worker: str,
        digest: str,
        heartbeat: Heartbeat | None,
        on_skipped: Callable[[int], None],
        step_tasks: Collection[Task] = (),
        *,
        count: SetCount | None = None,
        sealed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._writer = writer
        self._store = writer.store
        self._worker = worker
        self._digest = digest
        self._step_tasks = step_tasks  # the tasks the set's rows carry (``shared.compat.step_key``)
        self._heartbeat = heartbeat
        self._on_skipped = on_skipped
        self._count = count or SetCount()
        self._sealed = sealed
        self._register = threading.Event()  # register the set again before the next read (``reregister``)
        self._reregister_at = 0.0  # not before (monotonic): a try that failed waits REREGISTER_RETRY_S
        self._reseal = False  # registered again unsealed while its seal fell due: seal it
        self._state = threading.Condition()
        self._ready: list[Arrival] = []
        self._error: BaseException | None = None
        self._paused = False
        self._reading = False  # a read (or the claim of what it read) is in flight
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="step-arrivals", daemon=True)
        self._thread.start()

    def take(self) -> list[Arrival]:
        """What was read and claimed since the last call, in inbox order (no round trip); raises the error that
        stopped the thread, once (what was ready stays for ``stop``, whose owner releases or ends it)."""
        with self._state:
            error, self._error = self._error, None
            if error is not None:
                raise error
            ready, self._ready = self._ready, []
        return ready

    def pause(self, timeout_s: float) -> bool:
        """Stop reading and wait until no read is in flight (so the inbox holds whatever was not popped); False
        when a read is still in flight after ``timeout_s``."""
        with self._state:
            self._paused = True
            return self._state.wait_for(lambda: not self._reading, timeout_s)

    def drain(self, timeout_s: float) -> list[Arrival]:
        """``pause``, read and claim what is left in the inbox on the caller's thread, and ``take`` it all: the
        inbox then holds nothing sent before the call (the set may close when this is empty). Raises TimeoutError
        when a read stays in flight past ``timeout_s``; the reader stays paused until ``resume``."""
        self._read_rest(timeout_s)
        return self.take()

    def settle(self, timeout_s: float) -> None:
        """Read and claim everything sent so far (as ``drain``) and keep it for the next ``take``; then read on."""
        try:
            self._read_rest(timeout_s)
        finally:
            self.resume()

    def _read_rest(self, timeout_s: float) -> None:
        if not self.pause(timeout_s):
            raise TimeoutError(f"the inbox read did not end within {timeout_s:.0f} s")
        while True:
            raw = self._writer.redis(lambda: self._store.step_inbox_pop(self._worker), "reading the inbox")
            if raw is None:
                return
            arrival = self._prepare(raw)
            if arrival is not None:
                with self._state:
                    self._ready.append(arrival)

    def reregister(self) -> None:
        """The worker was swept from the live ones with its set's registration: register the set again before the
        next read (``step_reregister.lua``), once it is opened (any thread)."""
        self._register.set()

    def resume(self) -> None:
        """Read again after ``pause``."""
        with self._state:
            self._paused = False
            self._state.notify_all()

    def stop(self) -> list[Arrival]:
        """End the thread (bounded by ``STOP_TIMEOUT_S``); what it had claimed that no ``take`` took, for the owner
        to release or end (each ``Joiner`` is held by the heartbeat)."""
        with self._state:
            self._stopped = True
            self._state.notify_all()
        self._thread.join(STOP_TIMEOUT_S)
        with self._state:
            left, self._ready = self._ready, []
        return left

    # --- the thread -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._stopped or not self._paused)
                if self._stopped:
                    return
                self._reading = True
            try:
                if self._register.is_set() and time.monotonic() >= self._reregister_at:
                    self._try_reregister()
                raw = self._writer.redis(lambda: self._store.step_inbox_wait(self._worker, POLL_S), "reading the inbox")
                arrival = None if raw is None else self._prepare(raw)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it at its next take()
                with self._state:
                    self._error = exc
                    self._reading = False
                    self._state.notify_all()
                return
            with self._state:
                if arrival is not None:
                    self._ready.append(arrival)
                self._reading = False
                self._state.notify_all()

    def _try_reregister(self) -> None:
        """``_reregister``, an error logged and tried again after ``REREGISTER_RETRY_S`` (meanwhile the set runs on
        unregistered: no joins)."""
        try:
            self._reregister()
        except Exception as exc:  # noqa: BLE001 - the set runs on; its requests end as they would
            log.warning("set %s could not register again: %s: %s", self._digest, type(exc).__name__, exc)
            self._reregister_at = time.monotonic() + REREGISTER_RETRY_S

    def _reregister(self) -> None:
        """Register the swept set again (``step_reregister.lua``; on this thread, the one popping the inbox, while a
        read is in flight: ``pause`` waits for it). A seal that fell due meanwhile is written after it: the loop's
        own ``step_seal`` found no set while it was swept."""
        opened = self._count.opened
        if opened is None:  # not opened yet: its step_open registers it
            return
        if not self._reseal:
            set_id, rows = opened
            inbox = self._writer.redis(lambda: self._store.step_inbox(self._worker), "reading the inbox")
            waiting = sum(len(m.request_ids) for m in map(_message, inbox) if isinstance(m, BatchMessage))
            sealed = self._sealed()  # an eviction takes no room; an unreadable batch runs elsewhere
            value = STEP_SEALED if sealed else self._digest
            reply = self._writer.redis(
                lambda: self._store.step_reregister(self._worker, set_id, value, rows + waiting, len(inbox)),
                "registering the set",
            )
            if reply == -1:  # the worker is not live (swept again) or its inbox changed: try again
                self._reregister_at = time.monotonic() + REREGISTER_RETRY_S
                return
            if reply == 1:
                count = rows + waiting
                log.warning("set %s registered again after its worker was swept: %d requests", self._digest, count)
            # registered now, or by a try whose reply was lost (0): a seal due meanwhile is still to write
            self._reseal = reply >= 0 and not sealed and self._sealed()
        if self._reseal:
            self._writer.redis(lambda: self._store.step_seal(self._worker), "sealing the set")
            self._reseal = False
        self._register.clear()

    def _prepare(self, raw: str) -> Arrival | None:
        message = _message(raw)
        if message is None:
            log.error("unreadable batch message in the inbox, dropped (the reaper runs it again): %.200s", raw)
            return None
        if isinstance(message, StepEviction):
            return Eviction(message.evict, message.joiner)
        self._count.add(len(message.request_ids))  # step_join counted them in the set
        token = uuid.uuid4().hex
        claim = self._writer.redis(lambda: self._store.claim(message, token, self._worker), "claiming a batch")
        if isinstance(claim, Locked):
            log.info("batch %s sent to the set is held by another run: skipped", message.batch_id)
            self._on_skipped(len(message.request_ids))
            return None
        if self._heartbeat is not None:
            self._heartbeat.hold(message.batch_id, token)
        self._writer.redis(lambda: self._store.forward_done(message.batch_id, token), "marking the batch")
        # else the loop hands it back
        if all(step_key(spec, self._step_tasks).digest == self._digest for spec in claim.specs):
            self._writer.journal(claim.specs, token)
        return Joiner(message, claim)


class Writes:
    """The set's bookkeeping writes, in order, on one thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._done = threading.Condition(self._lock)
        self._error: BaseException | None = None
        self._inline = False
        self._thread = threading.Thread(target=self._run, name="step-writes", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], object]) -> None:
        """Run ``job`` after the writes submitted before it (at once, on this thread, after ``close``)."""
        with self._lock:
            inline = self._inline
            if not inline:
                self._pending += 1
        if inline:
            job()
        else:
            self._jobs.put(job)

    def check(self) -> None:
        """Raise the error that stopped the writes (once)."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def flush(self, timeout_s: float) -> None:
        """Wait until every write submitted so far is done (at most ``timeout_s``: then TimeoutError); raise the
        error that stopped them."""
        deadline = time.monotonic() + timeout_s
        with self._done:
            while self._pending and self._error is None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the set's writes did not finish within {timeout_s:.0f} s")
                self._done.wait(left)
        self.check()

    def close(self, timeout_s: float) -> None:
        """Flush, then run every later write on the caller's thread, and end the thread."""
        try:
            self.flush(timeout_s)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """End the thread without waiting for the writes left (Redis is away: their effects lapse); later writes
        run on the caller's thread."""
        with self._lock:
            self._inline = True
        self._jobs.put(None)
        self._thread.join(STOP_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                failed = self._error is not None or self._inline
            try:
                if not failed:  # after an error (or once abandoned) the writes left are dropped
                    job()
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it at its next check()
                with self._lock:
                    self._error = exc
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()
