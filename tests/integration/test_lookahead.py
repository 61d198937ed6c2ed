"""The worker's lookahead on real processes (``gpu_worker.lookahead``): with a backlog, a worker takes and claims its
next batch while a forward runs and runs it in the same task right after; every image is the one its request gives
run alone, text-to-image and image-to-image alike (the inputs of a batch claimed ahead are read ahead too); and the
same through either broker (RabbitMQ, a Redis of its own) with the simulated GPU, each batch run once.

``worker_lookahead_s`` is set far above a forward here, so the lookahead takes its next batch at the forward's first
step, as soon as the scheduler's prefetch has published it: every batch after the first two comes that way.
"""

from __future__ import annotations

import base64
import io
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import redis
from celery import _state as celery_state
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init, worker_process_shutdown
from PIL import Image

from gpu_worker import lookahead as lookahead_module
from gpu_worker.app import create_worker_app
from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages, Runner, StepCallback
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.celery_config import RUN_BATCH_TASK
from shared.contracts import BatchMessage, RequestSpec, Task
from shared.keys import RedisKeys
from shared.settings import Settings
from tests.integration.conftest import Fleet, running_fleet
from tests.support.broker import rabbitmq_or_skip
from tests.support.fleet import running_fleet as support_running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.solo import no_stop, png_array, solo_image
from tests.support.specs import demo_spec
from tests.unit.test_scripts import submit

pytestmark = pytest.mark.timeout(300)

STEPS, SIDE = 4, 64
CLAIMED_AHEAD = "claimed ahead of the forward running"  # the worker's log line (gpu_worker.app)


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    env = {
        "FUSEFLEET_WORKER_LOOKAHEAD_S": "60",
        "FUSEFLEET_MAX_NUM_SEQS": "2",
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    }
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path_factory.mktemp("lookahead-logs"), **env) as one:
        yield one


def claimed_ahead(fleet: Fleet) -> int:
    return sum(worker.log_path.read_text().count(CLAIMED_AHEAD) for worker in fleet.workers)


def encoded(seed: int) -> str:
    rng = np.random.default_rng(seed)
    picture = Image.fromarray(rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)).resize((SIDE, SIDE))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_batches_claimed_ahead_run_back_to_back_and_each_image_equals_its_solo_run(
    fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    before = claimed_ahead(fleet)
    body = {"width": SIDE, "height": SIDE, "num_inference_steps": STEPS}
    bodies = [{**body, "prompt": f"a fox {i}", "seed": 100 + i} for i in range(8)]
    ids = fleet.submit_batch(bodies)
    states = fleet.wait_done(ids)
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
    batches = {states[rid]["batch_id"] for rid in ids}
    assert len(batches) == 4  # max_num_seqs 2
    assert claimed_ahead(fleet) - before >= 2, fleet.logs_hint()  # the first two come through Celery at most
    for rid in ids:
        assert np.abs(png_array(fleet.image(rid)) - solo_image(solo_runner, states[rid])).max() <= 1, rid


def test_image_to_image_batches_claimed_ahead_read_their_inputs_and_equal_their_solo_runs(
    fleet: Fleet, solo_runner: DiffusersRunner
) -> None:
    before = claimed_ahead(fleet)
    body = {"num_inference_steps": STEPS, "guidance_scale": 5.0, "strength": 0.75}
    bodies = [{**body, "prompt": f"a heron {i}", "seed": 200 + i, "image": encoded(i)} for i in range(6)]
    ids = fleet.submit_batch(bodies)
    states = fleet.wait_done(ids)
    assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
    assert claimed_ahead(fleet) - before >= 1, fleet.logs_hint()
    for rid, request in zip(ids, bodies, strict=True):
        spec = demo_spec(
            "solo",
            STEPS,
            5.0,
            side=SIDE,
            seed=request["seed"],
            prompt=request["prompt"],
            task=Task.IMAGE_TO_IMAGE,
            strength=0.75,
        )
        source = Image.open(io.BytesIO(base64.b64decode(request["image"]))).convert("RGB")
        (solo,) = solo_runner.run([spec], no_stop, inputs={spec.id: InputImages(source)})[0]
        assert np.abs(png_array(fleet.image(rid)) - np.asarray(solo, dtype=np.int16)).max() <= 1, rid


SIM_ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    "FUSEFLEET_SIM_BASE_MS": "300",  # a forward of 0.3 s over its 4 steps
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_MAX_NUM_SEQS": "2",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_WORKER_LOOKAHEAD_S": "60",
}


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_batches_are_claimed_ahead_through_either_broker_and_each_runs_once(
    broker: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The lookahead reads the broker through kombu (``gpu_worker.queue_reader``): RabbitMQ and a Redis of its own
    alike, each batch run once (one attempt), on the one worker."""
    broker_server = RedisServer(tmp_path_factory.mktemp("broker-redis")).start() if broker == "redis" else None
    try:
        url = broker_server.url if broker_server is not None else rabbitmq_or_skip()
        logs = tmp_path_factory.mktemp(f"lookahead-{broker}")
        with support_running_fleet(redis_server.url, logs, SIM_ENV, broker_url=url) as fleet:
            ids = fleet.submit_batch([{"prompt": f"a wren {i}", "num_inference_steps": 4} for i in range(10)])
            states = fleet.wait_done(ids)
            assert {rid: s["status"] for rid, s in states.items()} == dict.fromkeys(ids, "succeeded"), states
            batches = {states[rid]["batch_id"] for rid in ids}
            assert len(batches) == 5
            assert all(int(fleet.redis.hget(fleet.keys.batch(b), "attempts") or 0) == 1 for b in batches)
            assert claimed_ahead(fleet) >= 2, fleet.logs_hint()
    finally:
        if broker_server is not None:
            broker_server.stop()


class HeldRunner(Runner):
    """The runner of an in-process worker (``in_process_worker``): each forward reports its first step, waits
    ``hold_s`` (a forward that runs far past what its pace said) and reports its last; reading its task list on
    another thread than the main one (the lookahead's, preparing the batch it took) waits for ``tasks_open``."""

    fused = True
    last: ClassVar[HeldRunner | None] = None

    def __init__(self, settings: Settings) -> None:
        self.forwards: list[list[str]] = []
        self.hold_s = 0.0
        self.tasks_open = threading.Event()
        self.tasks_open.set()
        self.tasks_asked = threading.Event()
        HeldRunner.last = self

    @property
    def tasks(self) -> frozenset[Task]:
        if threading.current_thread() is not threading.main_thread():
            self.tasks_asked.set()
            self.tasks_open.wait(10)
        return frozenset({Task.TEXT_TO_IMAGE})

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        self.forwards.append([spec.id for spec in specs])
        on_step(1, 2)
        time.sleep(self.hold_s)
        on_step(2, 2)
        return [[Image.new("RGB", (spec.width, spec.height))] for spec in specs]


@dataclass
class InProcessWorker:
    """A worker app's pool process run in this one (its ``worker_process_init`` called here): its batch task, its
    settings, its runner, and a client of its Redis (the fleet's and the broker)."""

    settings: Settings
    task: Any
    send: Callable[[BatchMessage], None]
    runner: HeldRunner
    client: redis.Redis
    keys: RedisKeys
    lease: Lease | None = None  # the scheduler's, to schedule batches

    def schedule(self, batch_id: str, *request_ids: str) -> BatchMessage:
        """Submit one request per id and move them into batch ``batch_id`` (as the scheduler does)."""
        submit(self.client, self.keys, *request_ids)  # type: ignore[arg-type]
        store = SchedulerStore(self.client, self.settings)
        if self.lease is None:
            self.lease = Lease(self.client, self.keys.scheduler_lease, 60_000)
            assert self.lease.try_acquire()
        lease = self.lease
        assert store.schedule(lease.key, lease.token, batch_id, list(request_ids)) == list(request_ids)
        return BatchMessage(batch_id=batch_id, request_ids=request_ids, created_at=time.time())

    def status(self, request_id: str) -> tuple[str | None, str | None]:
        """A request's status and claim token."""
        status, claim = self.client.hmget(self.keys.request(request_id), ["status", "claim"])
        return (None if status is None else str(status)), (None if claim is None else str(claim))


@pytest.fixture
def in_process_worker(redis_server: RedisServer) -> Iterator[InProcessWorker]:
    """The lookahead's worker app in this process, on the session's Redis (its Redis and its broker), with a
    ``HeldRunner`` (its first step says the forward ends at once: the next batch is taken then)."""
    settings = Settings(
        redis_url=redis_server.url,
        celery_broker_url=redis_server.url,
        key_prefix=f"inproc{uuid.uuid4().hex[:8]}",
        runner=f"{__name__}:HeldRunner",
        worker_lookahead_s=0.1,
        batch_lock_ttl_s=4.0,
    )
    signals = (worker_process_init, worker_process_shutdown)
    before = [list(signal.receivers) for signal in signals]
    finalizers = set(celery_state._on_app_finalizers)  # Celery's shared tasks: a later app would run this one's
    app = create_worker_app(settings, "inproc-worker")
    (init,), (shutdown,) = ([r for r in s.receivers if r not in b] for s, b in zip(signals, before, strict=True))
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        init[1]()
        assert HeldRunner.last is not None

        def send(message: BatchMessage) -> None:
            app.send_task(
                RUN_BATCH_TASK,
                args=[message.model_dump(mode="json")],
                task_id=message.batch_id,
                queue=settings.queue_name,
            )

        yield InProcessWorker(
            settings, app.tasks[RUN_BATCH_TASK], send, HeldRunner.last, client, SchedulerStore(client, settings).keys
        )
    finally:
        shutdown[1]()
        for signal, receiver in zip(signals, (init, shutdown), strict=True):
            signal.disconnect(receiver[1])
        celery_state._on_app_finalizers.intersection_update(finalizers)
        client.close()


def given_back(worker: InProcessWorker, batch_id: str, request_ids: Sequence[str]) -> bool:
    """The batch's lock is gone and its requests are running with no claim: handed back to the reaper uncounted."""
    if worker.client.exists(worker.keys.batch_lock(batch_id)):
        return False
    return all(worker.status(rid) == ("running", None) for rid in request_ids)


def test_a_batch_taken_ahead_is_given_back_when_the_chain_would_start_it_past_its_bound(
    in_process_worker: InProcessWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward before ran far past its pace's estimate (its first step said it would end at once): the batch
    taken at that step would start past the chain's bound (``CHAIN_S``, made 0.3 s here, plus the 0.1 s lead), so it
    is given back uncounted and the task ends, instead of running with less of the task's time limits left than
    planned."""
    worker = in_process_worker
    monkeypatch.setattr(lookahead_module, "CHAIN_S", 0.3)
    first, second = worker.schedule("B1", "a1"), worker.schedule("B2", "b1")
    worker.send(second)
    worker.runner.hold_s = 0.8
    worker.task(first.model_dump(mode="json"))
    assert worker.runner.forwards == [["a1"]]  # B2 was not run in this task
    wait_for(lambda: worker.status("a1")[0] == "succeeded", 10, "B1 to finish")
    assert given_back(worker, "B2", ["b1"]), worker.status("b1")


def test_a_batch_being_taken_ahead_when_the_task_is_interrupted_is_given_back(
    in_process_worker: InProcessWorker,
) -> None:
    """The soft time limit (a signal, raised wherever the task's thread is) lands while the task waits for the
    lookahead's take in progress: the batch that take claims is given back, not left claimed and held by the
    heartbeat with no run to come."""
    worker = in_process_worker
    first, second = worker.schedule("B1", "a1"), worker.schedule("B2", "b1")
    worker.send(second)
    worker.runner.hold_s = 0.3  # the take starts while the forward runs
    worker.runner.tasks_open.clear()  # the take claims B2, then waits in its preparation

    def soft_limit(signum: int, frame: object) -> None:
        raise SoftTimeLimitExceeded()

    def interrupt() -> None:
        assert worker.runner.tasks_asked.wait(10)
        time.sleep(0.6)  # the forward is over: the task waits for the take in collect
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        time.sleep(0.2)
        worker.runner.tasks_open.set()

    previous = signal.signal(signal.SIGUSR1, soft_limit)
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            worker.task(first.model_dump(mode="json"))
    finally:
        interrupter.join(10)
        signal.signal(signal.SIGUSR1, previous)
    assert worker.runner.forwards == [["a1"]]
    time.sleep(worker.settings.worker_heartbeat_s * 1.5)  # a beat that would renew a lock still held
    assert given_back(worker, "B2", ["b1"]), worker.status("b1")
