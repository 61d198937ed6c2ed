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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpu_worker.diffusers_runner import DiffusersRunner
from gpu_worker.runner import InputImages
from shared.contracts import Task
from tests.integration.conftest import Fleet, running_fleet
from tests.support.broker import rabbitmq_or_skip
from tests.support.fleet import running_fleet as support_running_fleet
from tests.support.redis_server import RedisServer
from tests.support.solo import no_stop, png_array, solo_image
from tests.support.specs import demo_spec

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
