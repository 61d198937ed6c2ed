"""Running one batch: claim it, run it fused (or request by request), store every result under its request id.

Contract: ``BatchExecutor.execute`` ends every request its claim runs (succeeded, failed or aborted), under that
claim's token only, or leaves the batch in flight with its lock lapsing for the reaper (Redis away past
``redis_outage_retry_s``); a failure fails only the requests it belongs to (a fused forward that raises is re-run
request by request, one out of memory halved first, ``gpu_worker.bisection``); every stored object is journaled
before it is written; an aborted request's outputs are never encoded or stored. Once a batch's forwards are over,
the rest (encoding, storing, finishing, releasing) is handed to a ``Finisher`` and ``execute`` returns.
The flow is docs/architecture.md#the-flow (step 3), each failure class and its bound docs/reliability.md.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from PIL import Image

from gpu_worker.bisection import Rows, bisect_on_failure, one_by_one
from gpu_worker.finisher import Finisher, InlineFinisher
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.log_context import carry_context
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.result_writer import ResultWriter, Statuses, error_info
from gpu_worker.runner import InputImages, Runner
from gpu_worker.set_forward import forward_by_steps
from gpu_worker.step_reporter import StepReporter
from gpu_worker.store import Claimed, Locked, RowSignal, WorkerStore
from shared.compat import CompatKey, compat_key
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, Task
from shared.results import ResultStore
from shared.retry import is_transient

log = logging.getLogger(__name__)

T = TypeVar("T")
Progress = tuple[int, int] | None
"""A forward's last (step, total), None when it reported no step."""


@dataclass(slots=True)
class BatchOutcome:
    """What happened to each request of a batch this worker claimed: ``statuses`` is complete once ``done`` is set
    (when ``execute`` returns with an inline finisher; once the outputs are stored with a background one)."""

    batch_id: str
    statuses: Statuses
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout_s: float | None = None) -> Statuses:
        """The statuses once the batch is finished (or as they stand after ``timeout_s``)."""
        self.done.wait(timeout_s)
        return dict(self.statuses)


class ForwardWatch(Protocol):
    """What looks on while a forward runs (``gpu_worker.lookahead.Lookahead``)."""

    def forward_started(self) -> None:
        """A forward begins."""

    def step(self, step: int, total: int) -> None:
        """It reached ``step`` of ``total`` (the runner's thread: must return at once)."""


class RunnerError(Exception):
    """The runner's output cannot be mapped back onto the batch's requests."""


@dataclass(slots=True)
class _Run:
    """One claimed run of a batch: its claim token, the decoded inputs of its image-conditioned requests, and the
    outputs of its forwards that wait to be stored (each forward's requests, their outputs, and its last (step,
    total), which their ending writes: ``StepReporter.close_unwritten``)."""

    token: str
    inputs: dict[str, InputImages] = field(default_factory=dict)
    outputs: list[tuple[list[RequestSpec], list[object], Progress]] = field(default_factory=list)
    last: str | None = None  # the request its last planned forward runs (that forward alone is watched)
    _ended: Statuses = field(default_factory=dict)  # requests ended while their forward ran (aborted)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # _ended is written by reporter threads

    @property
    def waiting_ids(self) -> set[str]:
        return {spec.id for specs, _, _ in self.outputs for spec in specs}

    def ended(self, statuses: Statuses) -> None:
        """These requests ended while their forward ran (any thread): their outputs are not stored."""
        with self._lock:
            self._ended.update(statuses)

    @property
    def ended_statuses(self) -> Statuses:
        """Each request ended while its forward ran, with its status after that."""
        with self._lock:
            return dict(self._ended)

    def keep(self, specs: Sequence[RequestSpec], outputs: Sequence[object], progress: Progress = None) -> None:
        """Keep a forward's outputs to store, less those of the requests already ended."""
        ended = self.ended_statuses
        kept = [(spec, output) for spec, output in zip(specs, outputs, strict=True) if spec.id not in ended]
        if kept:
            self.outputs.append(([spec for spec, _ in kept], [output for _, output in kept], progress))


@dataclass(slots=True)
class Prepared:
    """A claimed batch made ready to run (``BatchExecutor.prepare``): what its claim runs (``specs``), the statuses of
    those failed before any forward (``statuses``), and what escaped while preparing it (``error``, raised again
    where it runs)."""

    batch: BatchMessage
    claim: Claimed
    run: _Run
    outcome: BatchOutcome
    statuses: Statuses = field(default_factory=dict)
    specs: list[RequestSpec] = field(default_factory=list)
    error: BaseException | None = None


def decode_inputs(spec: RequestSpec, image: bytes | None, mask: bytes | None) -> InputImages:
    """The stored input image (and mask) of ``spec``, decoded; ValueError says what is wrong."""
    if image is None:
        raise ValueError("its input image is not stored (expired or never written)")
    if spec.task is Task.INPAINT and mask is None:
        raise ValueError("inpainting needs a mask, and none is stored")
    try:
        decoded = Image.open(io.BytesIO(image)).convert("RGB")
        decoded_mask = Image.open(io.BytesIO(mask)).convert("L") if spec.task is Task.INPAINT and mask else None
    except (OSError, ValueError) as exc:
        raise ValueError(f"its stored input image cannot be decoded: {type(exc).__name__}: {exc}") from None
    return InputImages(image=decoded, mask=decoded_mask)


def compat_groups(specs: Sequence[RequestSpec]) -> list[list[RequestSpec]]:
    """``specs`` split by compatibility key (one fused forward each), in the order of each group's first request;
    a batch of one key is one group. A step-mode scheduler batches by step key, which leaves out steps, guidance
    and output count, so a request-level worker may receive a batch of several compatibility keys."""
    groups: dict[CompatKey, list[RequestSpec]] = {}
    for spec in specs:
        groups.setdefault(compat_key(spec), []).append(spec)
    return list(groups.values())


class BatchExecutor:
    """Executes batches in one worker process with one loaded runner."""

    def __init__(
        self,
        store: WorkerStore,
        runner: Runner,
        worker: str,
        heartbeat: Heartbeat | None,
        results: ResultStore,
        *,
        outage_retry_s: float = 0.0,
        finisher: Finisher | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._store = store
        self._runner = runner
        self._traits = runner.traits
        self._worker = worker
        self._heartbeat = heartbeat
        self._finisher = finisher or InlineFinisher()
        self._metrics = metrics
        self.writer = ResultWriter(store, results, self._traits, outage_retry_s=outage_retry_s)
        """Ends this worker's requests (shared with the step-mode loop, ``gpu_worker.step_loop``)."""
        self.watch: ForwardWatch | None = None
        """Told when a batch's last planned forward starts (the one that runs its last request: the only one, when
        fused and of one key) and of each of its steps: the worker's lookahead (``gpu_worker.app``)."""

    def execute(self, batch: BatchMessage) -> BatchOutcome | Locked:
        """Run ``batch``'s forwards unless another run holds it (then ``Locked``: retry later), then hand its
        finishing to the finisher (see the module's docstring) and free the worker's slot.

        Raises only when Redis stays unreachable past ``outage_retry_s``; the batch is then left to the reaper.
        """
        prepared = self.claim_ahead(batch)
        return prepared if isinstance(prepared, Locked) else self.run_prepared(prepared)

    def claim_ahead(self, batch: BatchMessage) -> Prepared | Locked:
        """Claim ``batch`` and make it ready to run (``prepare``), or ``Locked`` when another run holds it: the
        worker's lookahead calls it while the current batch's forward runs (``gpu_worker.lookahead``), ``execute``
        right before running it. Raises only when Redis stays unreachable past ``outage_retry_s`` (nothing claimed
        then, or a claim whose lock lapses)."""
        token = uuid.uuid4().hex
        claim = self._redis(lambda: self._store.claim(batch, token, self._worker), "claiming the batch")
        return claim if isinstance(claim, Locked) else self.prepare(batch, claim)

    def execute_claimed(self, batch: BatchMessage, claim: Claimed) -> BatchOutcome:
        """``execute`` for a batch already claimed (``claim``): the step-mode loop hands over a batch it does not
        run as a set. Raises only when Redis stays unreachable past ``outage_retry_s``."""
        return self.run_prepared(self.prepare(batch, claim))

    def prepare(self, batch: BatchMessage, claim: Claimed) -> Prepared:
        """What a claimed batch needs before its first forward, done now (any thread): its lock renewed from here on
        (``Heartbeat.hold``), what cannot run here failed, its inputs read and decoded, its requests journaled. Never
        raises: what escapes is kept, and ``run_prepared`` deals with it as if its forwards had raised it."""
        token = claim.token
        if self._heartbeat is not None:
            self._heartbeat.hold(batch.batch_id, token)
        prepared = Prepared(batch, claim, _Run(token=token), BatchOutcome(batch.batch_id, dict(claim.statuses)))
        try:
            prepared.statuses, prepared.specs = self._prepare(claim, prepared.run)
            if prepared.specs:
                self.writer.journal(prepared.specs, token)
        except BaseException as exc:  # noqa: BLE001 - raised again where the batch runs (run_prepared)
            prepared.error = exc
        return prepared

    def run_prepared(self, prepared: Prepared) -> BatchOutcome:
        """Run a prepared batch's forwards, hand its finishing to the finisher and free the worker's slot (the rest
        of ``execute``). Raises only when Redis stays unreachable past ``outage_retry_s``."""
        batch, claim, run, outcome = prepared.batch, prepared.claim, prepared.run, prepared.outcome
        token = claim.token
        try:
            try:
                if prepared.error is not None:
                    raise prepared.error
                outcome.statuses.update(prepared.statuses)
                outcome.statuses.update(self._run_forwards(prepared.specs, run))
            except Exception as exc:  # noqa: BLE001 - whatever escaped, the requests must end and say why
                if is_transient(exc):
                    raise  # Redis stayed away: the requests did not fail, the batch runs again (reaper)
                log.exception("batch %s: %s escaped; failing what this run has not finished", batch.batch_id, exc)
                done = run.waiting_ids | set(run.ended_statuses) | set(prepared.statuses)
                errors = {spec.id: error_info(exc) for spec in claim.specs if spec.id not in done}
                outcome.statuses.update(self._fail(errors, token))
            outcome.statuses.update(run.ended_statuses)
            free_slot = bool(run.outputs or run.ended_statuses)  # a forward ran: its slot frees before the stores
            self._finisher.submit(carry_context(partial(self._finish, batch.batch_id, run, outcome, free_slot)))
        except BaseException:
            self._release(batch.batch_id, token)
            raise
        return outcome

    def _finish(self, batch_id: str, run: _Run, outcome: BatchOutcome, free_slot: bool = False) -> None:
        """Free the worker's slot (``free_slot``: off the next forward's path, one Redis round trip), store the
        outputs of the run's forwards, finish their requests, release the batch (the finisher's job).

        A store that fails for another reason than a Redis outage fails its requests with the error; through an
        outage past ``outage_retry_s`` the batch is left to the reaper."""
        try:
            if free_slot:
                self._free_slot(batch_id, run.token)
            for specs, outputs, progress in run.outputs:
                try:
                    stored = self.writer.store_results(specs, outputs, run.token, progress=progress)
                    outcome.statuses.update(stored)
                except Exception as exc:  # noqa: BLE001 - the requests must end and say why
                    if is_transient(exc):
                        raise
                    log.exception("batch %s: storing results failed; failing those requests", batch_id)
                    outcome.statuses.update(self._fail({spec.id: error_info(exc) for spec in specs}, run.token))
            run.outputs.clear()
            self._release(batch_id, run.token)
            seen = dict(outcome.statuses)  # every request of the batch, as this run saw it
            self._redis(lambda: self._store.batch_done(batch_id, run.token, seen), "releasing the batch")
            log.info("batch %s done: %s", batch_id, {rid: str(status) for rid, status in outcome.statuses.items()})
        except BaseException as exc:
            self._release(batch_id, run.token)
            if is_transient(exc):
                log.error("batch %s left to the reaper: Redis unavailable (%s)", batch_id, exc)
            raise
        finally:
            outcome.done.set()

    def _release(self, batch_id: str, token: str) -> None:
        if self._heartbeat is not None:
            self._heartbeat.release(batch_id, token)

    def _free_slot(self, batch_id: str, token: str) -> None:
        """Tell the scheduler this worker can take its next batch while this one's outputs are stored (best
        effort: otherwise the slot frees when the batch is done)."""
        try:
            self._store.forward_done(batch_id, token)
        except Exception as exc:  # noqa: BLE001 - only the next batch's start is delayed
            log.warning("batch %s: could not free the slot early: %s", batch_id, exc)

    def _redis(self, call: Callable[[], T], what: str) -> T:
        return self.writer.redis(call, what)

    def _run_forwards(self, specs: Sequence[RequestSpec], run: _Run) -> Statuses:
        """Run the forwards of the prepared ``specs``; their outputs wait in ``run.outputs``. Returns the statuses of
        the requests that failed on the way."""
        if not specs:
            return {}
        if not self._runner.fused:
            run.last = specs[-1].id
            return self._run_each(specs, run)
        statuses: Statuses = {}
        groups = compat_groups(specs)
        run.last = groups[-1][-1].id
        for group in groups:  # one group unless the batch mixes keys (a step-mode scheduler's batch)
            statuses.update(self._run_group(group, run))
        return statuses

    def _prepare(self, claim: Claimed, run: _Run) -> tuple[Statuses, list[RequestSpec]]:
        """Fail what this runner cannot run (a task it does not do, an input that cannot be read); decode the
        inputs of the rest into ``run``. Returns the statuses of those failed and the specs left to run."""
        supported = self._runner.tasks
        errors: dict[str, ErrorInfo] = {}
        for spec in claim.specs:
            if spec.task not in supported:
                does = ", ".join(sorted(task.value for task in supported))
                message = f"this fleet's runner ({type(self._runner).__name__}) does not do {spec.task}; it does {does}"
                errors[spec.id] = ErrorInfo(type="UnsupportedTask", message=message)
        conditioned = [spec for spec in claim.specs if spec.task.needs_image and spec.id not in errors]
        inputs = run.inputs
        if conditioned:
            ids = [spec.id for spec in conditioned]
            stored = self._redis(lambda: self._store.input_images(ids), "reading input images")
            for spec in conditioned:
                try:
                    inputs[spec.id] = decode_inputs(spec, *stored[spec.id])
                except ValueError as exc:
                    errors[spec.id] = ErrorInfo(type="InvalidInput", message=str(exc))
        statuses: Statuses = {}
        if errors:
            log.warning("%d requests cannot run here: %s", len(errors), errors)
            statuses = self._fail(errors, claim.token)
        return statuses, [spec for spec in claim.specs if spec.id not in errors]

    def _run_group(self, specs: Sequence[RequestSpec], run: _Run) -> Statuses:
        """One fused forward; on failure split (out of memory) or fall back to one by one (anything else):
        ``gpu_worker.bisection``. Returns the statuses of the requests that failed."""
        statuses: Statuses = {}
        bisect_on_failure([spec.id for spec in specs], self._rows(specs, run, statuses))
        return statuses

    def _run_each(self, specs: Sequence[RequestSpec], run: _Run) -> Statuses:
        """A forward of each request alone (a runner that is not fused); the statuses of those that failed."""
        statuses: Statuses = {}
        one_by_one([spec.id for spec in specs], self._rows(specs, run, statuses))
        return statuses

    def _rows(self, specs: Sequence[RequestSpec], run: _Run, statuses: Statuses) -> Rows[None]:
        """How ``bisect_on_failure`` runs some of ``specs`` (their outputs kept in ``run``) and fails one of them
        (its status in ``statuses``); a request aborted meanwhile is not run again."""
        by_id = {spec.id: spec for spec in specs}

        def forward(request_ids: Sequence[str]) -> None:
            chosen = [by_id[rid] for rid in request_ids]
            run.keep(chosen, *self._forward(chosen, run))

        def fail(request_id: str, error: ErrorInfo) -> None:
            statuses.update(self._fail({request_id: error}, run.token))

        return Rows(
            run=forward,
            fail=fail,
            release_memory=self._release_memory,
            what="fused forward",
            log=log,
            metrics=self._metrics,
            live=lambda request_id: request_id not in run.ended_statuses,
        )

    def _fail(self, errors: dict[str, ErrorInfo], token: str) -> Statuses:
        """End these requests of this claim as failed, each with its error (retried through an outage)."""
        return self.writer.fail(errors, token)

    def _forward(self, specs: Sequence[RequestSpec], run: _Run) -> tuple[list[list[Image.Image]], Progress]:
        """One runner call for ``specs``, its progress reported and its aborted requests ended as they are found
        (see the module's docstring); the outputs of every spec, in order, and the forward's last (step, total),
        left for their ending to write when the forward ran to its end."""
        on_aborted = partial(self._end_aborted, {spec.id: spec for spec in specs}, run)
        # only the batch's last planned forward is watched: a batch taken ahead during an earlier one (one request at
        # a time, one group of several) would wait, claimed, through all the forwards left
        watch = self.watch if any(spec.id == run.last for spec in specs) else None
        on_progress = watch.step if watch is not None else None
        reporter = StepReporter(
            self._store, [spec.id for spec in specs], run.token, on_aborted=on_aborted, on_progress=on_progress
        )
        if watch is not None:
            watch.forward_started()
        started = time.monotonic()
        progress: Progress = None
        ran = False
        try:
            by_steps = forward_by_steps(self._runner, specs, reporter)  # aborted rows leave at the next step
            if by_steps is not None:
                images = by_steps
            elif specs[0].task.needs_image:  # one key per batch: every spec has this task
                inputs = {spec.id: run.inputs[spec.id] for spec in specs}  # it lists the task (checked in _prepare)
                images = self._runner.run(specs, reporter.on_step, inputs=inputs)
            else:
                images = self._runner.run(specs, reporter.on_step)
            elapsed_s = time.monotonic() - started
            ran = True
        finally:
            if ran:  # its last step is written with the requests' ending (finish.lua)
                progress = reporter.close_unwritten()
            else:
                reporter.close()
            ended = run.ended_statuses
            late = [
                spec
                for spec, signal in zip(specs, reporter.signals, strict=True)
                if signal is RowSignal.ABORTED and spec.id not in ended
            ]
            if late:  # found by a write whose ending met an outage (finish.lua ends the rest): end it now
                log.info("aborted while running, ended after the forward: %s", [spec.id for spec in late])
                run.ended(self.writer.abort(late, run.token))
        if not isinstance(images, Sequence) or len(images) != len(specs):
            count = len(images) if isinstance(images, Sequence) else type(images).__name__
            raise RunnerError(f"runner returned {count} results for {len(specs)} requests")
        if self._metrics is not None:
            outputs = sum(spec.n for spec in specs)
            self._metrics.forward(len(specs), outputs, reporter.last_step, elapsed_s)
        return list(images), progress

    def _end_aborted(self, specs: dict[str, RequestSpec], run: _Run, request_ids: list[str]) -> None:
        """The step reporter's ``on_aborted`` (its thread): end these requests ``aborted`` at once, under the run's
        claim token, while their forward goes on; a Redis error is raised to the reporter, which tries again."""
        statuses = self.writer.abort([specs[rid] for rid in request_ids], run.token, retry=False)
        log.info("aborted while running, ended at once: %s", request_ids)
        run.ended(statuses)

    def _release_memory(self) -> None:
        self._runner.release_memory()
