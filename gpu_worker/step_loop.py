"""Step mode on the worker: a Celery batch opens a running set, which runs until it is empty while the scheduler
sends it more batches through the worker's inbox. The story (each step boundary, ends, failures, preemption, seal,
close, Redis outages) is docs/step_mode.md#the-fleet-in-step-mode.

``StepLoop.run(batch)`` claims the batch (``Locked`` when another run holds it) and, when its requests share one
step key the runner can run (``Runner.step_set``), runs them as the first members of a set until the set closes
(``SetOutcome``); otherwise the executor runs them request-level (``BatchExecutor.execute_claimed``, split by
compatibility key: they run there or fail saying why). It raises only when Redis stays unreachable past
``redis_outage_retry_s``: the held batches are then left to the reaper, and ``StepLoop.repair`` (the heartbeat's
first beat, or the next run) takes the set's registration down, so a dead set never holds the slot or takes joins.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from celery.exceptions import SoftTimeLimitExceeded

from gpu_worker.bisection import Rows, bisect_on_failure, is_out_of_memory
from gpu_worker.executor import BatchExecutor, BatchOutcome, decode_inputs
from gpu_worker.finisher import Finisher, InlineFinisher
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.log_context import carry_context, ids
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.result_writer import ResultWriter, Statuses, error_info
from gpu_worker.runner import InputImages, Runner, StepSet
from gpu_worker.step_boundary import MARGIN_S, Arrival, Arrivals, Eviction, Joiner, SetCount, Writes
from gpu_worker.step_reporter import StepReporter
from gpu_worker.store import Claimed, Locked, RowSignal, WorkerStore
from shared.compat import StepKey, step_key
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus
from shared.retry import is_transient

log = logging.getLogger(__name__)

STORE_POLL_S = 0.05
"""With nothing to step, how long the loop waits for a store in progress before it reads the inbox again."""
SETTLE_S = 60.0
"""How long a set that fails as a whole waits for the stores in progress before it releases its batches."""


@dataclass(slots=True)
class SetOutcome:
    """What a running set did: the batches it ran (the first one first) and each of their requests' status."""

    batches: list[str]
    statuses: Statuses


@dataclass(slots=True, eq=False)
class _Held:
    """A batch claimed into the set: its claim token and its requests still in the set."""

    batch_id: str
    token: str
    live: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True, eq=False)
class _Stored:
    """What the finisher did with requests of one batch: their statuses, or the Redis outage that stopped it."""

    held: _Held
    request_ids: list[str]
    outcome: Statuses | Exception


@dataclass(slots=True, eq=False)
class _Group:
    """Requests of one batch with one step count: they step in lockstep, so one reporter writes their progress and
    brings back their abort flags."""

    held: _Held
    total: int
    request_ids: list[str]
    reporter: StepReporter


class StepLoop:
    """Runs the batches of one worker process as step-mode running sets (see the module's docstring)."""

    def __init__(
        self,
        runner: Runner,
        worker: str,
        heartbeat: Heartbeat | None,
        writer: ResultWriter,
        fallback: BatchExecutor,
        *,
        seal_after_s: float,
        metrics: WorkerMetrics | None = None,
        finisher: Finisher | None = None,
    ) -> None:
        self.runner = runner
        self.worker = worker
        self.heartbeat = heartbeat
        self.writer = writer
        self.store: WorkerStore = writer.store
        self.fallback = fallback
        self.seal_after_s = seal_after_s
        self.metrics = metrics
        self.finisher: Finisher = finisher or InlineFinisher()
        # a set left behind, taken down by repair() or the next run: at start, a dead predecessor's (a pool process
        # replaced after a kill has its worker name); later, one a run could not take down (Redis away)
        self.drop_pending = True
        self._running = False
        self._current: _RunningSet | None = None
        self._guard = threading.Lock()  # between run() and repair() (the heartbeat's thread)
        if heartbeat is not None:
            heartbeat.after_beat(self.repair)
            heartbeat.after_rejoin(self._reregister)

    def repair(self) -> None:
        """After a beat (the heartbeat's thread): take down a set that a run could not (Redis was away, or the run
        was interrupted), once Redis answers and no set runs, so that it neither holds the worker's slot nor takes
        joins that no loop reads (they would wait for their claim timeout)."""
        with self._guard:
            if self.drop_pending and not self._running:
                self._drop_stale()

    def _reregister(self) -> None:
        """A beat found the worker swept from the live ones (the heartbeat's thread): the set that runs, if any,
        registers again (``Arrivals.reregister``)."""
        current = self._current
        if current is not None:
            current.arrivals.reregister()

    def _drop_stale(self) -> None:
        self.drop()
        self.drop_pending = False

    def drop(self) -> None:
        """Take this worker's running set down (``step_drop``): batches left in its inbox go to the reaper."""
        left = self.store.step_drop(self.worker)
        if left:
            log.warning("took a running set down with %d batches in its inbox (the reaper runs them again)", len(left))

    def release_memory(self) -> None:
        self.runner.release_memory()

    def settle(self) -> None:
        """Wait until the running set has claimed every batch sent to it so far (they join at its next boundary)
        and made every count-out and release it submitted: the state a boundary of the loop before its round trips
        went to threads would show (for a test that looks at the set between steps; the loop itself never waits)."""
        current = self._current
        if current is not None:
            current.settle()

    def run(self, batch: BatchMessage) -> SetOutcome | BatchOutcome | Locked:
        """Claim ``batch`` and run it as a new running set until the set closes; ``Locked`` when another run holds
        it; the executor's outcome when it runs request-level. Raises only when Redis stays unreachable past the
        outage bound (the batches are then left to the reaper)."""
        with self._guard:
            self._running = True
            if self.drop_pending:
                self.writer.redis(self._drop_stale, "taking down a set left behind")
        try:
            return self._run(batch)
        finally:
            with self._guard:
                self._running = False

    def _run(self, batch: BatchMessage) -> SetOutcome | BatchOutcome | Locked:
        token = uuid.uuid4().hex
        claim = self.writer.redis(lambda: self.store.claim(batch, token, self.worker), "claiming the batch")
        if isinstance(claim, Locked):
            return claim
        if self.heartbeat is not None:  # held while the set is made (a LoRA may load): its lock must not lapse
            self.heartbeat.hold(batch.batch_id, token)
        keys = {step_key(spec, self.runner.traits.step_tasks) for spec in claim.specs}
        if len(keys) != 1:
            if claim.specs:
                log.info("batch %s mixes %d step keys: running it request-level", batch.batch_id, len(keys))
            return self.fallback.execute_claimed(batch, claim)
        (key,) = keys
        try:
            step_set = self.runner.step_set(key)
        except SoftTimeLimitExceeded:
            if self.heartbeat is not None:
                self.heartbeat.release(batch.batch_id, token)
            raise
        except Exception as exc:  # noqa: BLE001 - request-level then runs the batch, or fails it saying why
            if is_transient(exc):
                if self.heartbeat is not None:
                    self.heartbeat.release(batch.batch_id, token)
                raise
            log.info("batch %s runs request-level: %s: %s", batch.batch_id, type(exc).__name__, exc)
            return self.fallback.execute_claimed(batch, claim)
        self._current = _RunningSet(self, key, step_set)
        try:
            return self._current.run(batch, claim)
        finally:
            self._current = None


class _RunningSet:
    """One running set, from its first batch to its close."""

    def __init__(self, loop: StepLoop, key: StepKey, step_set: StepSet) -> None:
        self.loop = loop
        self.store = loop.store
        self.writer = loop.writer
        self.worker = loop.worker
        self.digest = key.digest
        self.step_tasks = loop.runner.traits.step_tasks  # which tasks leave its requests' step keys
        self.set = step_set
        self.held: dict[str, _Held] = {}  # batch id -> its claim
        self.owner: dict[str, _Held] = {}  # live request id -> its batch's claim
        self.specs: dict[str, RequestSpec] = {}
        self.groups: list[_Group] = []
        self.storing: dict[str, _Held] = {}  # request id -> its batch's claim, while the finisher stores it
        self.stored: queue.SimpleQueue[_Stored] = queue.SimpleQueue()  # what the finisher did, for the loop
        self.outcome = SetOutcome(batches=[], statuses={})
        self.opened = time.monotonic()
        self.sealed = False
        self.bound_s = self.writer.outage_retry_s + MARGIN_S  # the longest a wait on the boundary threads takes
        self.finishing: dict[_Held, list[StepReporter]] = {}  # reporters to close before storing, per batch
        self.leaving: set[str] = set()  # live requests in their last step, counted out of the set already
        self.later: list[Arrival] = []  # taken, to join at the next boundary (a swap's joiner, ``_take_arrivals``)
        self.releasing: list[_Held] = []  # batches whose release (BATCH_DONE) was submitted
        self.writes = Writes()
        self.count = SetCount()  # what the set holds or was sent (a swept set registers again with it)
        self.arrivals = Arrivals(
            self.writer,
            self.worker,
            self.digest,
            loop.heartbeat,
            on_skipped=self._leave,
            step_tasks=self.step_tasks,
            count=self.count,
            sealed=self._seal_due,
        )

    # --- the loop -------------------------------------------------------------------------------------------------

    def run(self, first: BatchMessage, claim: Claimed) -> SetOutcome:
        try:
            self._hold(first.batch_id, claim.token)
            set_id = self.writer.redis(
                lambda: self.store.step_open(self.worker, self.digest, len(claim.specs)), "opening the set"
            )
            self.count.open(len(claim.specs), set_id)
            self._admit(first, claim)
            while True:
                self._seal_when_due()
                self._take_arrivals()
                self._collect()
                if not self.owner:
                    if self.storing:  # nothing to step: wait for the stores (joiners still read each round)
                        self._collect(wait_s=STORE_POLL_S)
                        continue
                    if self._close():
                        break
                    continue
                finished = self._step()
                self._report(finished)
                if finished:
                    self._finish(finished)
        except Exception as exc:
            if is_transient(exc):
                self._abandon(exc)
                raise
            self._fail_all(exc)
        except BaseException:
            self._release_all()
            self.loop.drop_pending = True  # the heartbeat takes the set down (StepLoop.repair)
            raise
        finally:
            self.writes.abandon()  # flushed by the close or the cleanup; dropped when Redis is away
            self._release_joiners()
        statuses = self.outcome.statuses
        log.info("set %s closed: %s", self.digest, {rid: str(status) for rid, status in statuses.items()})
        return self.outcome

    def _seal_due(self) -> bool:
        """The set is sealed or its seal is due (any thread)."""
        return self.sealed or time.monotonic() - self.opened >= self.loop.seal_after_s

    def _seal_when_due(self) -> None:
        if not self.sealed and self._seal_due():
            self.writer.redis(lambda: self.store.step_seal(self.worker), "sealing the set")  # none while swept
            self.sealed = True
            log.info("set %s sealed after %.0f s: no more joins", self.digest, time.monotonic() - self.opened)

    def _take_arrivals(self, arrivals: Sequence[Arrival] | None = None) -> None:
        """Join every batch the scheduler sent to the set that ``Arrivals`` claimed since the last boundary (or
        ``arrivals``), and evict as asked, in inbox order; raise what stopped the boundary threads. The requests
        whose next step is their last are counted out once what joins here is taken (``_count_out_last``)."""
        self.writes.check()
        taken = [*self.later, *(self.arrivals.take() if arrivals is None else arrivals)]
        self.later = []
        self._count_out_last()  # before this boundary's joins run: the scheduler has their time too
        joined = False
        held_back: set[str] = set()  # swap joiners whose room frees only at the next boundary
        for arrival in taken:
            if isinstance(arrival, Eviction):
                if not self._evict(arrival) and arrival.joiner is not None:
                    held_back.add(arrival.joiner)
                continue
            if arrival.message.batch_id in held_back:
                self.later.append(arrival)
                continue
            self._hold(arrival.message.batch_id, arrival.claim.token, beat=False)  # Arrivals had it held
            self._admit(arrival.message, arrival.claim, counted=len(arrival.message.request_ids), prepared=True)
            joined = True
        if joined:
            self._count_out_last()  # a joiner whose first step is its last

    def _count_out_last(self) -> None:
        """Count out of the set, one step early, the live requests whose next step is their last: the scheduler
        sends joiners for their room while that step runs, and they join at the boundary where these leave, so a
        saturated set runs no step a row short. Safe: this boundary's joiners were taken before, and every live
        request is stepped (or fails) at the next step, so a joiner never runs beside the request whose room it
        took (``docs/step_mode.md``, *Each step boundary*)."""
        progress = self.set.progress()
        last = [
            rid
            for rid in self.owner
            if rid not in self.leaving and rid in progress and progress[rid][0] + 1 >= progress[rid][1]
        ]
        if last:
            self._leave(len(last), last)
            self.leaving.update(last)

    def _close(self) -> bool:
        """The set is empty: close it unless something arrived (then it goes on). Every batch popped from the inbox
        is taken and every count-out made first, so ``step_close`` sees what the scheduler sees."""
        arrivals = self.arrivals.drain(self.bound_s)
        if arrivals or self.later:
            self.arrivals.resume()
            self._take_arrivals(arrivals)
            return False
        self.writes.flush(self.bound_s)
        if self.writer.redis(lambda: self.store.step_close(self.worker), "closing the set"):
            return True
        self.arrivals.resume()
        return False

    def settle(self) -> None:
        """``StepLoop.settle``."""
        self.arrivals.settle(self.bound_s)
        self.writes.flush(self.bound_s)

    # --- joining --------------------------------------------------------------------------------------------------

    def _hold(self, batch_id: str, token: str, *, beat: bool = True) -> None:
        self.held[batch_id] = _Held(batch_id, token)
        self.outcome.batches.append(batch_id)
        if beat and self.loop.heartbeat is not None:
            self.loop.heartbeat.hold(batch_id, token)

    def _inputs(self, specs: Sequence[RequestSpec]) -> tuple[dict[str, InputImages], dict[str, ErrorInfo]]:
        """The decoded input image (and mask) of each image-task request of ``specs`` (one Redis read), and the
        error of each whose inputs cannot be read (it fails alone, ``InvalidInput``, as request-level)."""
        conditioned = [spec for spec in specs if spec.task.needs_image]
        if not conditioned:
            return {}, {}
        ids = [spec.id for spec in conditioned]
        stored = self.writer.redis(lambda: self.store.input_images(ids), "reading input images")
        inputs: dict[str, InputImages] = {}
        errors: dict[str, ErrorInfo] = {}
        for spec in conditioned:
            try:
                inputs[spec.id] = decode_inputs(spec, *stored[spec.id])
            except ValueError as exc:
                errors[spec.id] = ErrorInfo(type="InvalidInput", message=str(exc))
        return inputs, errors

    def _admit(
        self, message: BatchMessage, claim: Claimed, counted: int | None = None, *, prepared: bool = False
    ) -> None:
        """Join the claimed batch's running requests to the set. ``counted``: the requests ``P:step:rows`` counts
        for the batch (None: exactly those the claim runs, as the set was opened with). ``prepared``: ``Arrivals``
        marked it ``FORWARD_DONE`` and journaled its result keys already."""
        held = self.held[message.batch_id]
        self.outcome.statuses.update(claim.statuses)
        if not prepared:
            self.writer.redis(lambda: self.store.forward_done(message.batch_id, held.token), "marking the batch")
        specs = claim.specs
        if counted is not None:
            self._leave(counted - len(specs))
        foreign = [spec.id for spec in specs if step_key(spec, self.step_tasks).digest != self.digest]
        if foreign:  # not sent by step_join (a stale inbox entry): hand the batch back, the reaper republishes it
            log.warning("batch %s has requests of another step key (%s): handed back", message.batch_id, foreign)
            self._leave(len(specs))
            self._end_batch(held)
            return
        if not prepared:
            self.writer.journal(specs, held.token)
        inputs, unreadable = self._inputs(specs)
        if unreadable:
            self.outcome.statuses.update(self.writer.fail(unreadable, held.token))
            self._leave(len(unreadable))
            specs = [spec for spec in specs if spec.id not in unreadable]
        try:
            refused = self.set.join(specs, inputs)
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - the joiner fails alone (its prompt encoding, its latents)
            if is_transient(exc):
                raise
            if is_out_of_memory(exc):
                self.loop.release_memory()
            log.exception("batch %s could not join the set; failing its %d requests", message.batch_id, len(specs))
            error = error_info(exc)
            self.outcome.statuses.update(self.writer.fail({spec.id: error for spec in specs}, held.token))
            self._leave(len(specs))
            self._end_batch(held)
            return
        for spec in specs:
            if spec.id not in refused:
                self.specs[spec.id] = spec
                self.owner[spec.id] = held
                held.live.add(spec.id)
        levels = {spec.id: spec.priority for spec in specs if spec.id in held.live}
        if levels:
            self.writes.submit(
                lambda: self.writer.redis(
                    lambda: self.store.step_levels(self.worker, levels), "recording the requests' levels"
                )
            )
        if refused:
            log.warning("batch %s: %d requests refused by the set: %s", message.batch_id, len(refused), refused)
            errors = {rid: ErrorInfo(type="InvalidRequest", message=why) for rid, why in refused.items()}
            self.outcome.statuses.update(self.writer.fail(errors, held.token))
            self._leave(len(refused))
        progress = self.set.progress()
        by_total: dict[int, list[str]] = {}
        for spec in specs:
            if spec.id in held.live:
                by_total.setdefault(progress.get(spec.id, (0, spec.num_inference_steps))[1], []).append(spec.id)
        for total, request_ids in by_total.items():
            reporter = StepReporter(self.store, request_ids, held.token)
            self.groups.append(_Group(held, total, request_ids, reporter))
        if not held.live:
            self._end_batch(held)

    # --- stepping -------------------------------------------------------------------------------------------------

    def _step(self) -> list[str]:
        """One step of every live request; the requests it finished. A step that raises is halved (out of memory)
        or re-run request by request (anything else), so culprits fail alone (``gpu_worker.bisection``)."""
        everyone = list(self.owner)
        how = Rows(
            run=self._step_only,
            fail=lambda request_id, error: self._fail_requests({request_id: error}),
            release_memory=self.loop.release_memory,
            what="step",
            log=log,
            metrics=self.loop.metrics,
            passes=is_transient,
        )
        stepped = bisect_on_failure(everyone, how, whole=lambda: self._step_only(everyone, whole=True))
        return [request_id for finished in stepped for request_id in finished]

    def _step_only(self, request_ids: Sequence[str], *, whole: bool = False) -> list[str]:
        """One fused step of ``request_ids`` (``whole``: they are every live request); the requests it finished."""
        started = time.monotonic()
        finished = self.set.step(None if whole else request_ids)
        if self.loop.metrics is not None:
            images = sum(self.specs[rid].n for rid in finished if rid in self.specs)
            self.loop.metrics.forward(len(request_ids), images, 1, time.monotonic() - started)
        return finished

    def _report(self, finished: Sequence[str]) -> None:
        """Hand each group's step to its reporter; end the requests whose signal says aborted or not ours. A group
        whose requests all finished writes its final step before they are finished (its reporter is closed)."""
        done = set(finished)
        progress = self.set.progress()
        aborted: list[str] = []
        dropped: list[str] = []
        closing: list[_Group] = []
        for group in self.groups:
            live = [rid for rid in group.request_ids if self.owner.get(rid) is group.held]
            if not live:
                closing.append(group)
                continue
            if all(rid in done for rid in live):
                group.reporter.on_step(group.total, group.total)
                closing.append(group)
                self.finishing.setdefault(group.held, []).append(group.reporter)  # its store waits for the write
                continue
            group.reporter.on_step(max((progress[rid][0] for rid in live if rid in progress), default=0), group.total)
            for rid, signal in zip(group.request_ids, group.reporter.signals, strict=True):
                if self.owner.get(rid) is not group.held or rid in done or signal is RowSignal.GO_ON:
                    continue
                self.set.abort(rid)
                (aborted if signal is RowSignal.ABORTED else dropped).append(rid)
        for group in closing:
            group.reporter.close(wait=False)
            self.groups.remove(group)
        if aborted:
            log.info("aborted while running: %s", aborted)
            for held, request_ids in self._by_batch(aborted).items():
                self.outcome.statuses.update(self.writer.abort([self.specs[rid] for rid in request_ids], held.token))
        if dropped:
            log.warning("claimed by another run or ended meanwhile, dropped: %s", dropped)
        self._ended([*aborted, *dropped])

    def _finish(self, finished: list[str]) -> None:
        """Decode the requests a step finished (one decode for all, on the loop: it uses the accelerator), count them
        out of the set at once where their last step's boundary did not (their room goes to joiners), and hand
        storing and finishing them to the finisher, one job per batch, so the next steps run while their images are
        encoded and written (``_collect`` takes the outcome back)."""
        try:
            images: Sequence[object] = self.set.outputs(finished)
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:
            if is_transient(exc):
                raise
            log.exception("decoding %d finished requests failed", len(finished))
            self._fail_requests({rid: error_info(exc) for rid in finished})
            return
        outputs = dict(zip(finished, images, strict=True))
        for held, request_ids in self._by_batch(finished).items():
            specs = [self.specs.pop(rid) for rid in request_ids]
            for rid in request_ids:
                del self.owner[rid]
                self.storing[rid] = held
            results = [outputs[rid] for rid in request_ids]
            reporters = self.finishing.pop(held, [])
            self.loop.finisher.submit(carry_context(partial(self._store, held, specs, results, reporters)))
        self.finishing.clear()
        self._count_out(finished)

    def _store(
        self, held: _Held, specs: list[RequestSpec], results: list[object], reporters: Sequence[StepReporter] = ()
    ) -> None:
        """The finisher's job: store and finish these requests of one batch, once their reporters wrote their final
        step (so a finished request shows ``step == total``); the outcome goes back to the loop (a Redis outage past
        the bound goes back as the error, for the loop to leave the set to the reaper)."""
        for reporter in reporters:
            reporter.close()
        outcome: Statuses | Exception
        try:
            outcome = self.writer.store_results(specs, results, held.token)
        except Exception as exc:  # noqa: BLE001 - the requests must end and say why
            if is_transient(exc):
                outcome = exc
            else:
                log.exception("storing results failed; failing those requests")
                try:
                    outcome = self.writer.fail({spec.id: error_info(exc) for spec in specs}, held.token)
                except Exception as again:  # noqa: BLE001 - handed to the loop
                    outcome = again
        self.stored.put(_Stored(held, [spec.id for spec in specs], outcome))

    def _collect(self, wait_s: float = 0.0) -> None:
        """Take back what the finisher stored (waiting up to ``wait_s`` for the first one): record the statuses and
        release each batch none of whose requests is left. An error it handed back is raised here."""
        try:
            done = [self.stored.get(timeout=wait_s) if wait_s > 0 else self.stored.get_nowait()]
        except queue.Empty:
            return
        while True:
            try:
                done.append(self.stored.get_nowait())
            except queue.Empty:
                break
        for stored in done:
            for rid in stored.request_ids:
                self.storing.pop(rid, None)
                stored.held.live.discard(rid)
        failure = next((stored.outcome for stored in done if isinstance(stored.outcome, Exception)), None)
        if failure is not None:
            raise failure
        for stored in done:
            assert not isinstance(stored.outcome, Exception)
            self.outcome.statuses.update(stored.outcome)
            if not stored.held.live and stored.held.batch_id in self.held:
                self._end_batch(stored.held)

    def _settle(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the stores in progress, so that no batch is released under them."""
        deadline = time.monotonic() + timeout_s
        while self.storing and time.monotonic() < deadline:
            self._collect(wait_s=STORE_POLL_S)

    # --- ending ---------------------------------------------------------------------------------------------------

    def _by_batch(self, request_ids: Sequence[str]) -> dict[_Held, list[str]]:
        batches: dict[_Held, list[str]] = {}
        for rid in request_ids:
            batches.setdefault(self.owner[rid], []).append(rid)
        return batches

    def _fail_requests(self, errors: dict[str, ErrorInfo]) -> None:
        """Take these live requests out of the set and end them failed with their errors."""
        for rid in errors:
            self.set.abort(rid)
        for held, request_ids in self._by_batch(list(errors)).items():
            self.outcome.statuses.update(self.writer.fail({rid: errors[rid] for rid in request_ids}, held.token))
        self._ended(list(errors))

    def _evict(self, eviction: Eviction) -> bool:
        """The scheduler asked to evict a request for a request of a higher level, or (``joiner``: a swap) for
        the batch it sent with the eviction: take it out of the set and requeue it (``requeue.lua``), unless it
        ended meanwhile, the set is sealed and no joiner was named (then its room would go to no one) or it is in
        its last step (counted out already: its room went to the scheduler). The set's count and levels hash drop
        with the requeue itself. False when the request runs its last step now: a swap's joiner then waits for the
        next boundary, so that the set never runs past its cap (``_take_arrivals``); else True."""
        request_id = eviction.request_id
        held = self.owner.get(request_id)
        if held is None or (self.sealed and eviction.joiner is None) or request_id in self.leaving:
            why = "it is not in the set (it ended meanwhile)"
            if held is not None:
                why = "the set is sealed" if self.sealed else "it leaves at the next step (its room was given already)"
            log.info("eviction of %s ignored: %s", request_id, why, extra=ids(request_id=request_id))
            return held is None or request_id not in self.leaving
        self.set.abort(request_id)
        outcome = self.writer.redis(
            lambda: self.store.requeue(request_id, held.token, self.worker), "requeueing a request"
        )
        if outcome == 1:
            self.count.subtract(1)  # requeue.lua counted it out
            log.info(
                "request %s evicted from the set for %s and requeued",
                request_id,
                "a higher level" if eviction.joiner is None else f"batch {eviction.joiner}",
                extra=ids(request_id=request_id, batch_id=held.batch_id),
            )
            self.outcome.statuses[request_id] = RequestStatus.QUEUED
            self._ended([request_id], counted=False)
        elif outcome == 2:  # flagged aborted meanwhile: it ends so, as at any boundary
            self.outcome.statuses.update(self.writer.abort([self.specs[request_id]], held.token))
            self._ended([request_id])
        else:
            log.warning("request %s to evict is no longer this run's: dropped", request_id)
            self._ended([request_id])
        return True

    def _ended(self, request_ids: Sequence[str], *, counted: bool = True) -> None:
        """These requests left the set: count them out (unless ``counted`` is False: ``requeue.lua`` did), and
        release each batch none of whose requests is left."""
        emptied: list[_Held] = []
        for rid in request_ids:
            held = self.owner.pop(rid)
            self.specs.pop(rid, None)
            held.live.discard(rid)
            if not held.live and held not in emptied:
                emptied.append(held)
        if counted:
            self._count_out(request_ids)
        for held in emptied:
            self._end_batch(held)

    def _count_out(self, request_ids: Sequence[str]) -> None:
        """These requests ran in the set and no longer take room in it: the scheduler may send joiners instead.
        Those counted out ahead of their last step (``_count_out_last``) are not counted twice."""
        left = [rid for rid in request_ids if rid not in self.leaving]
        self.leaving.difference_update(request_ids)
        self._leave(len(left), left)

    def _leave(self, count: int, ran: Sequence[str] = ()) -> None:
        if count:
            token = uuid.uuid4().hex  # one per count-out: a retry after a lost reply is counted once
            ran = list(ran)

            def count_out() -> None:  # one thread, in order: one count-out in flight at a time (step_leave.lua)
                self.writer.redis(
                    lambda: self.store.step_leave(self.worker, count, ran, token=token), "counting requests out"
                )
                self.count.subtract(count)  # once made: until then the set is still counted with them

            self.writes.submit(count_out)

    def _end_batch(self, held: _Held) -> None:
        for group in [group for group in self.groups if group.held is held]:
            group.reporter.close(wait=False)
            self.groups.remove(group)
        self.held.pop(held.batch_id, None)
        self.releasing.append(held)

        def release() -> None:
            self.writer.redis(lambda: self.store.batch_done(held.batch_id, held.token), "releasing the batch")
            self._let_go(held)  # after BATCH_DONE: its lock is renewed until then

        self.writes.submit(release)

    def _release(self, held: _Held) -> None:
        self.held.pop(held.batch_id, None)
        self._let_go(held)

    def _let_go(self, held: _Held) -> None:
        """The heartbeat stops renewing the batch's lock (any thread; again is harmless)."""
        if self.loop.heartbeat is not None:
            self.loop.heartbeat.release(held.batch_id, held.token)

    def _release_joiners(self) -> list[Joiner]:
        """Stop ``Arrivals``; the batches it claimed that never joined are let go (their locks lapse: the reaper
        runs them again), and returned."""
        left = [arrival for arrival in [*self.later, *self.arrivals.stop()] if isinstance(arrival, Joiner)]
        self.later = []
        for joiner in left:
            self._release(_Held(joiner.message.batch_id, joiner.claim.token))
        return left

    def _fail_all(self, exc: Exception) -> None:
        """Something escaped the loop (a bug, the soft time limit): every live request fails with it, every held
        batch ends, and the set is taken down (batches left in the inbox go to the reaper)."""
        log.exception("set %s: %s escaped; failing its %d live requests", self.digest, exc, len(self.owner))
        try:
            self.writes.close(self.bound_s)  # what was submitted is done first; later writes run on this thread
            for joiner in self._release_joiners():  # claimed ahead of a boundary, never joined: they fail too
                self._fail_joiner(joiner, error_info(exc))
            self._settle(SETTLE_S)
            for held, request_ids in self._by_batch(list(self.owner)).items():
                errors = {rid: error_info(exc) for rid in request_ids}
                self.outcome.statuses.update(self.writer.fail(errors, held.token))
            self.owner.clear()
            for group in self.groups:
                group.reporter.close(wait=False)
            self.groups.clear()
            for held in list(self.held.values()):
                self._end_batch(held)
            self._drop()
        except Exception as cleanup:
            self._abandon(cleanup)  # whatever failed the cleanup: no hold outlives the set, the drop is retried
            raise

    def _abandon(self, exc: BaseException) -> None:
        """Redis stayed away: let every held batch's lock lapse (the reaper runs them again) and try once to take
        the set down."""
        log.error("set %s left to the reaper: Redis unavailable (%s)", self.digest, exc)
        self.writes.abandon()
        self._release_joiners()
        self._release_all()
        try:
            self._drop()
        except Exception as again:  # noqa: BLE001 - the heartbeat retries it (StepLoop.repair)
            log.warning("could not take the set down (the heartbeat tries again): %s", again)
            self.loop.drop_pending = True

    def _release_all(self) -> None:
        for group in self.groups:
            group.reporter.close(wait=False)
        self.groups.clear()
        for held in [*self.held.values(), *self.releasing]:  # a release the writes did not make lapses too
            self._release(held)

    def _fail_joiner(self, joiner: Joiner, error: ErrorInfo) -> None:
        """End a batch claimed ahead of a boundary that never joined: its requests fail with ``error``."""
        token = joiner.claim.token
        self.outcome.batches.append(joiner.message.batch_id)
        self.outcome.statuses.update(joiner.claim.statuses)
        self.outcome.statuses.update(self.writer.fail({spec.id: error for spec in joiner.claim.specs}, token))
        self.writer.redis(lambda: self.store.batch_done(joiner.message.batch_id, token), "releasing the batch")

    def _drop(self) -> None:
        self.loop.drop()
