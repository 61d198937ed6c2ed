"""The Celery worker: one process per GPU, one forward at a time, the model loaded once in the pool process.

``fusefleet worker`` calls ``run_worker``: the parent process stays free of torch (CUDA is not fork-safe); the
prefork child loads the runner in ``worker_process_init``, starts the heartbeat that makes it a free slot for the
scheduler, and then executes ``fusefleet.run_batch`` tasks. A task returns once its batch's forwards are over: the
batch is finished (outputs encoded and stored, requests ended) by the process's ``BackgroundFinisher`` while the
next task runs its forward. At shutdown the process waits up to ``FINISH_ON_SHUTDOWN_S`` for that finish; a
finisher that gets stuck (a result store that hangs) makes the process release its batches and exit
(``STUCK_EXIT_CODE``), and Celery replaces it.

With ``FUSEFLEET_STEP_MODE`` and a runner whose model has a step-mode adapter (``Runner.step_mode``), a task instead
opens a running set with its batch and runs it until the set closes (``gpu_worker.step_loop``): the scheduler sends
further batches of the same step key to the worker's inbox, and each request is stored and finished by the same
finisher behind the set's next steps. The loop's first beat takes down a set a dead predecessor of this process
(same worker name) left behind (``StepLoop.repair``).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.signals import worker_process_init, worker_process_shutdown
from celery.utils.nodenames import default_nodename

from gpu_worker.executor import BatchExecutor
from gpu_worker.finisher import BackgroundFinisher
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.runner import load_runner
from gpu_worker.step_loop import StepLoop
from gpu_worker.store import Locked, WorkerStore
from shared.celery_config import RUN_BATCH_TASK, broker_transport, make_celery
from shared.contracts import BatchMessage, WorkerCapabilities
from shared.redis_conn import sync_client
from shared.results import build_result_store
from shared.retry import TRANSIENT_ERRORS
from shared.settings import Settings

log = logging.getLogger(__name__)

FINISH_ON_SHUTDOWN_S = 60.0
"""How long a stopping worker process waits for the batch it is finishing; past it the batch's lock lapses and the
reaper runs it again."""

STUCK_EXIT_CODE = 70  # EX_SOFTWARE
"""The exit status of a pool process whose finisher got stuck (``gpu_worker.finisher``); Celery starts another."""


@dataclass
class _ProcessState:
    executor: BatchExecutor | None = None
    heartbeat: Heartbeat | None = None
    finisher: BackgroundFinisher | None = None
    metrics: WorkerMetrics | None = None
    step_loop: StepLoop | None = None


def default_worker_name() -> str:
    return f"fusefleet-worker@{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def create_worker_app(settings: Settings, worker_name: str) -> Celery:
    """A Celery app with the batch task registered and the per-process model loading wired."""
    app = make_celery(settings)
    state = _ProcessState()

    def init_process(**_: Any) -> None:
        binary = sync_client(settings, binary=True)
        store = WorkerStore(sync_client(settings), settings, binary=binary)
        runner = load_runner(settings)
        capabilities = WorkerCapabilities(
            model=settings.model_id,
            pipeline=runner.pipeline_name,
            tasks=tuple(sorted(runner.tasks)),
            traits=runner.traits,
        )
        state.heartbeat = Heartbeat(
            store,
            worker_name,
            settings.worker_heartbeat_s,
            capabilities,
            hold_limit_s=settings.batch_time_limit_s,
            on_announce=lambda: consume(True),
        )
        state.finisher = BackgroundFinisher(stuck_after_s=settings.batch_time_limit_s, on_stuck=retire)
        state.metrics = WorkerMetrics(sync_client(settings), store.keys)
        state.executor = BatchExecutor(
            store,
            runner,
            worker_name,
            state.heartbeat,
            build_result_store(settings, binary),
            outage_retry_s=settings.redis_outage_retry_s,
            finisher=state.finisher,
            metrics=state.metrics,
        )
        if settings.step_mode and runner.step_mode:
            state.step_loop = StepLoop(
                runner,
                worker_name,
                state.heartbeat,
                state.executor.writer,
                state.executor,
                seal_after_s=settings.soft_time_limit_s / 2,
                metrics=state.metrics,
                finisher=state.finisher,
            )
        elif settings.step_mode:
            log.warning("step mode is on, but %s has no step-mode adapter: batches run request-level", runner)
        state.heartbeat.start()
        log.info(
            "worker %s ready (runner %s, fused=%s, step mode=%s)",
            worker_name,
            settings.runner,
            runner.fused,
            state.step_loop is not None,
        )

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
        """Have this worker's Celery process consume the batch queue, or stop (a remote-control broadcast to
        itself; best effort: a quarantined process hands back whatever it still receives, ``run_batch``)."""
        command = app.control.add_consumer if on else app.control.cancel_consumer
        try:
            command(settings.queue_name, destination=[default_nodename(worker_name)], reply=False)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.warning("could not %s consuming %s: %s", "resume" if on else "stop", settings.queue_name, exc)

    def shutdown_process(**_: Any) -> None:
        if state.finisher is not None and not state.finisher.close(FINISH_ON_SHUTDOWN_S):
            log.error("stopping with a batch unfinished after %.0f s; the reaper runs it again", FINISH_ON_SHUTDOWN_S)
        if state.metrics is not None:
            state.metrics.close(5.0)
        if state.heartbeat is not None:
            state.heartbeat.stop()

    # weak=False: the receivers are closures that must live as long as the app
    worker_process_init.connect(init_process, weak=False)
    worker_process_shutdown.connect(shutdown_process, weak=False)

    @app.task(name=RUN_BATCH_TASK, bind=True, max_retries=None)  # type: ignore[untyped-decorator]
    def run_batch(self: Task, message: dict[str, Any]) -> None:
        if state.executor is None:
            raise RuntimeError("worker process was not initialised (worker_process_init did not run)")
        batch = BatchMessage.model_validate(message)
        if state.heartbeat is not None and state.heartbeat.quarantined:
            # this worker's result store hung lately: claim nothing, let the reaper publish the batch again now
            log.warning("batch %s handed back: this worker is quarantined", batch.batch_id)
            writer = state.executor.writer
            writer.redis(lambda: writer.store.give_back(batch.batch_id, None), "handing the batch back")
            return
        try:
            if state.step_loop is not None:
                outcome = state.step_loop.run(batch)
            else:
                outcome = state.executor.execute(batch)
        except TRANSIENT_ERRORS as exc:
            # Redis stayed away past redis_outage_retry_s: the batch keeps its place in flight, its lock lapses,
            # and the scheduler's reaper publishes it again once Redis is back (docs/reliability.md).
            log.error("batch %s left to the reaper: Redis unavailable (%s)", batch.batch_id, exc)
            return
        if isinstance(outcome, Locked):
            # another worker runs this batch (a duplicate delivery): look again when its lock could lapse
            raise self.retry(countdown=outcome.retry_after_s)

    return app


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """Run a Celery worker in the foreground (prefork pool of one process)."""
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
            settings.queue_name,
        ]
    )
