"""The Celery worker: one process per GPU, one forward at a time, the models loaded once in the pool process.

``fusefleet worker`` calls ``run_worker``: the parent process stays free of torch (CUDA is not fork-safe); the
prefork child loads one runner per model it serves (``FUSEFLEET_WORKER_MODELS``) in ``worker_process_init``, keeping
at most ``max_resident_models`` of them loaded (``gpu_worker.residency``: a model evicted is loaded again when a batch
of it comes), starts the heartbeat that makes it a free slot for the scheduler (announcing each model's capabilities
and residency), and then executes ``fusefleet.run_batch`` tasks from the queues of its models and its own queue
(``shared.routing``). A batch of a model it does not serve is fenced: never claimed nor run, it is handed back
uncounted and the reaper publishes it again to its model's queue; so is one of a model it has no room to load yet
(``residency.NotNow``), which the scheduler then places again.
A task returns once its batch's forwards are over: the batch is finished (outputs encoded and stored, requests
ended) by the process's ``BackgroundFinisher`` while the next task runs its forward. At shutdown the process waits
up to ``FINISH_ON_SHUTDOWN_S`` for that finish; a finisher that gets stuck (a result store that hangs) makes the
process release its batches and exit (``STUCK_EXIT_CODE``), and Celery replaces it.

While a batch's forward runs, the process looks ahead (``gpu_worker.lookahead``, ``worker_lookahead_s``; a fleet of
one model, request-level mode): near the forward's end one thread takes the next message from the worker's queues
and claims its batch, and the task runs that batch right after the current one, and so on (a chain, bounded by
``lookahead.chain_open``); the task returns when no next batch was taken, and Celery hands the next one over.

With ``FUSEFLEET_STEP_MODE``, a worker of one model, and a runner whose model has a step-mode adapter
(``Runner.step_mode``), a task instead opens a running set with its batch and runs it until the set closes
(``gpu_worker.step_loop``): the scheduler sends further batches of the same step key to the worker's inbox, and each
request is stored and finished by the same finisher behind the set's next steps. The loop's first beat takes down a
set a dead predecessor of this process (same worker name) left behind (``StepLoop.repair``).

In a sharded fleet (``model_shards``) a worker serves the models of one shard and runs entirely inside it:
``run_worker`` builds everything from ``Shards.settings_of`` its shard (``worker_settings``), and refuses to start
(``ShardsError``, naming the shards) when its models span several.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task
from celery.signals import worker_process_init, worker_process_shutdown
from celery.utils.nodenames import default_nodename
from pydantic import ValidationError

from gpu_worker.executor import BatchExecutor, Prepared
from gpu_worker.finisher import BackgroundFinisher
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.lookahead import Lookahead, Miss, chain_may_start, chain_open
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.output_bounds import OutputBounds
from gpu_worker.prompt_cache import PromptCache
from gpu_worker.queue_reader import REDIS_OPTIONS as READER_REDIS_OPTIONS
from gpu_worker.queue_reader import QueueReader
from gpu_worker.residency import NotNow, Residency, shared_footprints
from gpu_worker.runner import Runner, load_runner
from gpu_worker.step_loop import StepLoop
from gpu_worker.store import Locked, WorkerStore
from shared.celery_config import RUN_BATCH_TASK, broker_transport, make_celery, publish_options
from shared.contracts import BatchKnee, BatchMessage, ModelCapabilities, WorkerCapabilities
from shared.logging_setup import ids, log_context
from shared.redis_conn import sync_client
from shared.results import build_result_store
from shared.retry import TRANSIENT_ERRORS, call_with_retry
from shared.routing import served_queues
from shared.settings import Settings
from shared.shards import Shards

log = logging.getLogger(__name__)

FINISH_ON_SHUTDOWN_S = 60.0
"""How long a stopping worker process waits for the batch it is finishing; past it the batch's lock lapses and the
reaper runs it again."""

STUCK_EXIT_CODE = 70  # EX_SOFTWARE
"""The exit status of a pool process whose finisher got stuck (``gpu_worker.finisher``); Celery starts another."""


@dataclass
class _Served:
    """One model the process serves: its runner, the runner's executor, and its step-mode loop when it runs one."""

    runner: Runner
    executor: BatchExecutor
    step_loop: StepLoop | None = None


@dataclass(slots=True)
class _Next:
    """The next batch, taken from ``queue`` while a forward ran: claimed and ready (``prepared``), or to run through
    the ordinary path (``prepared`` None: a model not resident, a worker quarantined since)."""

    batch: BatchMessage
    message: dict[str, Any]
    queue: str
    prepared: Prepared | None = None


@dataclass(slots=True)
class _Chain:
    """The batches one task runs back to back: when it began, and when its current batch did (monotonic)."""

    began: float
    batch_began: float


@dataclass
class _ProcessState:
    residency: Residency[_Served] | None = None  # the models served, at most max_resident_models loaded
    static: dict[str, ModelCapabilities] = field(default_factory=dict)  # what each model is, learnt at its first load
    store: WorkerStore | None = None
    heartbeat: Heartbeat | None = None
    finisher: BackgroundFinisher | None = None
    metrics: WorkerMetrics | None = None
    knee_margin: float = 0.1  # settings.batch_knee_margin
    lookahead: Lookahead[_Next] | None = None  # the next batch, taken while a forward runs (None: off)
    reader: QueueReader | None = None  # the lookahead's broker connection
    chain: _Chain | None = None  # the chain the running task runs (the lookahead's take reads it)

    def route(self, model: str | None) -> str | None:
        """Which served model runs a batch of ``model``: itself, or None when this process does not serve it (a
        message with no model, from a scheduler before several models: the one model of a process that serves
        one)."""
        served = self.residency.models if self.residency is not None else ()
        if model is None:
            return served[0] if len(served) == 1 else None
        return model if model in served else None

    def capabilities(self) -> WorkerCapabilities:
        """The announcement: each model's capabilities with its residency now."""
        assert self.residency is not None
        states = self.residency.announce()
        held = self.residency.held()
        return WorkerCapabilities.of(
            tuple(
                self.static[model].model_copy(
                    update={
                        "resident": state.resident,
                        "load_s": state.load_s,
                        "batch_s": state.batch_s,
                        "batch_knees": _knees_of(held.get(model), self.knee_margin),
                    }
                )
                for model, state in states.items()
            )
        )


def _knees_of(served: _Served | None, margin: float) -> tuple[BatchKnee, ...]:
    """The batch knees a resident model's runner measured (``gpu_worker.batch_knee``); none for a runner that
    measures none, or a model not loaded (the scheduler then caps at max_num_seqs alone)."""
    knees = getattr(served.runner, "batch_knees", None) if served is not None else None
    return tuple(knees(margin)) if callable(knees) else ()


def _free_memory(model: str) -> None:
    """A model was evicted (its last reference dropped): collect it and give the accelerator's cache back."""
    gc.collect()
    torch = sys.modules.get("torch")  # imported by any runner that holds accelerator memory
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _capabilities_of(model: str, runner: Runner) -> ModelCapabilities:
    return ModelCapabilities(
        model=model, pipeline=runner.pipeline_name, tasks=tuple(sorted(runner.tasks)), traits=runner.traits
    )


def default_worker_name() -> str:
    return f"fusefleet-worker@{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def worker_settings(settings: Settings) -> Settings:
    """The settings a worker of the fleet ``settings`` runs with: the fleet's inside the shard it serves
    (``Shards.shard_of_worker``: ``worker_shard``, else the one its models share; the fleet's own settings without
    ``model_shards``). Raises ``ShardsError`` naming the shards when its models span several (set ``worker_models``
    to one shard's models), or share several and ``worker_shard`` is unset or not one of them."""
    shards = Shards(settings)
    return shards.settings_of(shards.shard_of_worker())


def create_worker_app(settings: Settings, worker_name: str) -> Celery:
    """A Celery app with the batch task registered and the per-process model loading wired; ``settings`` are the
    worker's own (its shard's: ``worker_settings``)."""
    app = make_celery(settings)
    state = _ProcessState()

    def init_process(**_: Any) -> None:
        binary = sync_client(settings, binary=True)
        store = state.store = WorkerStore(sync_client(settings), settings, binary=binary)
        models = settings.served_models
        state.finisher = BackgroundFinisher(stuck_after_s=settings.batch_time_limit_s, on_stuck=retire)
        state.knee_margin = settings.batch_knee_margin
        state.metrics = WorkerMetrics(sync_client(settings), store.keys)
        metrics = state.metrics
        results = build_result_store(settings, binary)
        # what it announces is set once every model's capabilities are known (warm, below), before its first beat
        state.heartbeat = Heartbeat(
            store,
            worker_name,
            settings.worker_heartbeat_s,
            WorkerCapabilities(model=models[0], pipeline="loading", tasks=()),
            hold_limit_s=settings.batch_time_limit_s,
            on_announce=lambda: consume(True),
        )
        heartbeat = state.heartbeat

        def load(model: str) -> _Served:
            runner = load_runner(settings.for_model(model))
            if isinstance(cache := getattr(runner, "prompt_cache", None), PromptCache):
                cache.on_lookup = metrics.prompt_cache
            executor = BatchExecutor(
                store,
                runner,
                worker_name,
                heartbeat,
                results,
                outage_retry_s=settings.redis_outage_retry_s,
                finisher=state.finisher,
                metrics=metrics,
            )
            executor.watch = state.lookahead
            executor.writer.bounds = OutputBounds(settings.max_request_output_bytes, settings.max_batch_output_bytes)
            served = _Served(runner, executor)
            if settings.step_mode and runner.step_mode and len(models) == 1:
                served.step_loop = StepLoop(
                    runner,
                    worker_name,
                    heartbeat,
                    executor.writer,
                    executor,
                    seal_after_s=settings.soft_time_limit_s / 2,
                    metrics=metrics,
                    finisher=state.finisher,
                )
            elif settings.step_mode:
                # one running set per worker: a worker of several models runs them request-level (docs/models.md)
                why = "no step-mode adapter" if not runner.step_mode else "a worker of several models"
                log.warning("step mode is on, but %s (%s): %s batches run request-level", model, why, model)
            if model not in state.static:
                state.static[model] = _capabilities_of(model, runner)
                log.info(
                    "worker %s serves %s (runner %s, fused=%s, step mode=%s)",
                    worker_name,
                    model,
                    settings.runner,
                    runner.fused,
                    served.step_loop is not None,
                )
            return served

        if settings.worker_lookahead_s > 0 and len(settings.catalog) == 1 and not settings.step_mode:
            # in the pool process: a thread and a broker connection do not survive the fork
            options = READER_REDIS_OPTIONS if broker_transport(settings).name == "redis" else None
            state.reader = QueueReader(app, served_queues(settings, worker_name), options)
            state.lookahead = Lookahead(take_next, settings.worker_lookahead_s, on_stale=hand_back)
        state.residency = Residency(
            models,
            load,
            _free_memory,
            max_resident=settings.max_resident_models,
            min_residency_s=settings.min_residency_s,
            share=shared_footprints(settings.catalog, models),
            on_load=metrics.model_loaded,
            on_evict=metrics.model_evicted,
        )
        state.residency.warm()
        heartbeat.update(state.capabilities())
        heartbeat.start()
        held = ", ".join(state.residency.held())
        log.info("worker %s ready: %s (resident: %s)", worker_name, ", ".join(models), held)

    def retire(reason: str) -> None:
        """The finisher is stuck (a result store that hangs under this process): take no more batches. Quarantine
        the worker for ``worker_quarantine_s``: stop the Celery process taking messages (``consume``), give the
        batches held back uncounted (``Heartbeat.withdraw``: the reaper publishes them again to other workers, and
        no request is charged a lost run), then exit the pool process at once (its stuck thread cannot be
        stopped otherwise). Celery's prefork pool starts a new one, which announces no slot until the quarantine
        ends (then it consumes again and probes the store with its next batch); the task this one was running, if
        any, is rejected (late ack) and runs again as a duplicate that finds its batch republished or held."""
        log.critical("worker %s is stuck (%s): quarantined, giving its batches back and exiting", worker_name, reason)
        consume(False)  # first: the batches given back are published again within a second
        if state.heartbeat is not None:
            state.heartbeat.withdraw(reason)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(STUCK_EXIT_CODE)

    def consume(on: bool) -> None:
        """Have this worker's Celery process consume the queues of its models, or stop (a remote-control broadcast
        to itself; best effort: a quarantined process hands back whatever it still receives, ``run_batch``)."""
        command = app.control.add_consumer if on else app.control.cancel_consumer
        for queue in served_queues(settings, worker_name):
            try:
                command(queue, destination=[default_nodename(worker_name)], reply=False)
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("could not %s consuming %s: %s", "resume" if on else "stop", queue, exc)

    def shutdown_process(**_: Any) -> None:
        if state.finisher is not None and not state.finisher.close(FINISH_ON_SHUTDOWN_S):
            log.error("stopping with a batch unfinished after %.0f s; the reaper runs it again", FINISH_ON_SHUTDOWN_S)
        if state.metrics is not None:
            state.metrics.close(5.0)
        if state.heartbeat is not None:
            state.heartbeat.stop()

    def announce() -> None:
        """Beat now with the residency as it is (best effort: the next beat carries it anyway)."""
        if state.heartbeat is not None:
            state.heartbeat.update(state.capabilities())

    # weak=False: the receivers are closures that must live as long as the app
    worker_process_init.connect(init_process, weak=False)
    worker_process_shutdown.connect(shutdown_process, weak=False)

    def retry_later(message: dict[str, Any], queue: str, countdown_s: float) -> None:
        """Publish a batch message again, to run after ``countdown_s`` (another run holds its batch): what
        ``Task.retry`` does for the task's own message, for one the lookahead took."""
        run_batch.apply_async(
            args=[message],
            task_id=message.get("batch_id"),
            countdown=countdown_s,
            queue=queue,
            **publish_options(settings),
        )

    def take_next() -> _Next | Miss:
        """The lookahead's take (its thread): the next message of the worker's queues, its batch claimed and
        prepared when its model is resident here; ``Miss.STOP`` once the chain is long enough (``chain_open``)."""
        chain, residency, heartbeat = state.chain, state.residency, state.heartbeat
        now = time.monotonic()
        if (
            chain is None
            or residency is None
            or not chain_open(now - chain.began, now - chain.batch_began, settings.soft_time_limit_s)
        ):
            return Miss.STOP
        got = state.reader.take() if state.reader is not None else Miss.STOP
        if isinstance(got, Miss):
            return got
        message, queue = got
        try:
            batch = BatchMessage.model_validate(message)
        except ValidationError as exc:  # as the task would: it fails, its message acknowledged
            log.error("dropped a message of %s that is no batch: %s", queue, exc)
            return Miss.STOP
        model = state.route(batch.model)
        served = residency.held().get(model) if model is not None else None
        if served is None or served.step_loop is not None or (heartbeat is not None and heartbeat.quarantined):
            return _Next(batch, message, queue)  # the ordinary path decides (loads, hands back)
        prepared = served.executor.claim_ahead(batch)
        if isinstance(prepared, Locked):  # a duplicate delivery: look again when its lock could lapse
            retry_later(message, queue, prepared.retry_after_s)
            return Miss.STOP
        log.info("batch %s claimed ahead of the forward running", batch.batch_id, extra=ids(batch_id=batch.batch_id))
        return _Next(batch, message, queue, prepared)

    def hand_back(taken: _Next | None) -> None:
        """Give a batch taken ahead back uncounted (the chain stopped on an error): the reaper publishes it again."""
        if taken is None or state.store is None:
            return
        store = state.store
        token = taken.prepared.claim.token if taken.prepared is not None else None
        if token is not None and state.heartbeat is not None:
            state.heartbeat.release(taken.batch.batch_id, token)
        try:
            store.give_back(taken.batch.batch_id, token)
        except Exception as exc:  # noqa: BLE001 - its lock lapses (or its claim times out) for the reaper instead
            log.warning("could not give back batch %s taken ahead: %s", taken.batch.batch_id, exc)

    def run_one(batch: BatchMessage, prepared: Prepared | None) -> Locked | None:
        """Run one batch (claimed already when ``prepared``): route it, load its model if need be, hand it back when
        this process cannot run it, else run it. ``Locked`` when another run holds it."""
        residency, store = state.residency, state.store
        if residency is None or store is None:
            raise RuntimeError("worker process was not initialised (worker_process_init did not run)")
        model = state.route(batch.model)
        quarantined = prepared is None and state.heartbeat is not None and state.heartbeat.quarantined
        served: _Served | None = None
        why = "this worker is quarantined" if quarantined else f"its model {batch.model} is not served here"
        if model is not None and not quarantined:
            was_resident = residency.resident(model)
            try:
                served = residency.acquire(model)  # loads it (evicting the least recently used) if need be
            except NotNow as wait:
                why = str(wait)
            except Exception as exc:  # noqa: BLE001 - a load that failed (out of memory, a broken checkpoint)
                log.exception("could not load %s for batch %s", model, batch.batch_id)
                why = f"loading {model} failed ({type(exc).__name__}: {exc})"
            if not was_resident:
                announce()  # the scheduler sees the new residency now, not at the next beat
        if served is None or model is None:
            # quarantined (this worker's result store hung lately), a batch of a model it does not serve (fenced:
            # it never runs) or one it has no room to load yet: claim nothing, and the reaper publishes the batch
            # again now, placed again, with no attempt counted
            log.warning("batch %s handed back: %s (serves %s)", batch.batch_id, why, ", ".join(residency.models))
            token = prepared.claim.token if prepared is not None else None
            call_with_retry(
                lambda: store.give_back(batch.batch_id, token),
                what="handing the batch back",
                give_up_after_s=settings.redis_outage_retry_s,
            )
            return None
        started = time.monotonic()
        knees = _knees_of(served, state.knee_margin)
        outcome: object
        try:
            if prepared is not None:
                outcome = served.executor.run_prepared(prepared)
            elif served.step_loop is not None:
                outcome = served.step_loop.run(batch)
            else:
                outcome = served.executor.execute(batch)
        except TRANSIENT_ERRORS as exc:
            # Redis stayed away past redis_outage_retry_s: the batch keeps its place in flight, its lock lapses,
            # and the scheduler's reaper publishes it again once Redis is back (docs/reliability.md).
            log.error("batch %s left to the reaper: Redis unavailable (%s)", batch.batch_id, exc)
            return None
        finally:
            residency.release(model, time.monotonic() - started)
        if _knees_of(served, state.knee_margin) != knees:
            announce()  # the scheduler caps this model's batches at the new knee from now on
        return outcome if isinstance(outcome, Locked) else None

    @app.task(name=RUN_BATCH_TASK, bind=True, max_retries=None)  # type: ignore[untyped-decorator]
    def run_batch(self: Task, message: dict[str, Any]) -> None:
        """Run the batch of ``message``, then each batch the lookahead took meanwhile (its chain), one after the
        other; a batch another run holds is retried after its lock could lapse."""
        batch = BatchMessage.model_validate(message)
        lookahead = state.lookahead
        began = time.monotonic()
        state.chain = chain = _Chain(began, began)
        taken: _Next | None = None  # the batch running now, when the lookahead took it
        waiting: _Next | None = None  # collected, not started: given back if the task ends before it starts
        try:
            while True:
                if lookahead is not None:
                    lookahead.arm()
                if taken is None:  # the task's own batch
                    locked = run_one(batch, None)
                else:
                    with log_context(batch_id=batch.batch_id):
                        locked = run_one(batch, taken.prepared)
                waiting = lookahead.collect() if lookahead is not None else None
                if locked is not None:  # another worker runs this batch (a duplicate delivery)
                    if taken is None:  # look again when its lock could lapse
                        raise self.retry(countdown=locked.retry_after_s, **publish_options(settings))  # bounded
                    retry_later(taken.message, taken.queue, locked.retry_after_s)
                if waiting is None:
                    return
                chain_s = time.monotonic() - chain.began
                if not chain_may_start(chain_s, settings.soft_time_limit_s, settings.worker_lookahead_s):
                    # the batch before ran far past its estimate (forwards left after the one looked ahead of, a
                    # forward that stalled, the soft limit): started now, it could meet the task's time limits
                    log.warning(
                        "batch %s taken ahead given back: its chain has run %.1f s", waiting.batch.batch_id, chain_s
                    )
                    hand_back(waiting)
                    waiting = None
                    return
                taken, waiting = waiting, None
                batch = taken.batch
                chain.batch_began = time.monotonic()
        except BaseException:
            # whatever ended the task (an error, the soft limit, a retry), a batch taken ahead and not started (or
            # still being taken) goes back: none is left claimed and held with no run to come
            hand_back(waiting)
            if lookahead is not None:
                hand_back(lookahead.collect())
            raise
        finally:
            state.chain = None

    return app


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """Run a Celery worker of the fleet ``settings`` in the foreground (prefork pool of one process), inside its
    models' shard (``worker_settings``: ``ShardsError`` when they span several)."""
    settings = worker_settings(settings)
    worker_name = settings.worker_name or default_worker_name()
    for warning in broker_transport(settings).warnings(settings):
        log.warning("broker: %s", warning)
    app = create_worker_app(settings, worker_name)
    app.worker_main(
        [
            "worker",
            f"--loglevel={loglevel}",
            "--pool=prefork",
            "--concurrency=1",
            "--prefetch-multiplier=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-O",
            "fair",
            "-n",
            worker_name,
            "-Q",
            ",".join(served_queues(settings, worker_name)),
        ]
    )
