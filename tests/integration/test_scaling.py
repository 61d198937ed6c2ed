"""Horizontal scaling and worker shutdown: three real worker processes against one Redis."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer

LOCK_TTL_S = 3.0
SLOW = {"num_inference_steps": 120}


@pytest.fixture(scope="module")
def fleet3(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with running_fleet(
        redis_server,
        model_cache,
        lora_dir,
        tmp_path_factory.mktemp("fleet3-logs"),
        workers=3,
        FUSEFLEET_TORCH_THREADS="1",
        FUSEFLEET_BATCH_LOCK_TTL_S=str(LOCK_TTL_S),
        FUSEFLEET_WORKER_HEARTBEAT_S="0.5",
        FUSEFLEET_WORKER_TTL_S="2",
    ) as fleet:
        yield fleet


def attempts(fleet: Fleet, batch_id: str) -> int:
    return int(fleet.redis.hget(fleet.keys.batch(batch_id), "attempts") or 0)


def test_every_worker_takes_batches_and_no_request_runs_twice(fleet3: Fleet) -> None:
    body = {"requests": [{"prompt": f"scaled {i}", "num_inference_steps": 8} for i in range(24)]}
    ids = fleet3.http.post("/v1/requests/batch", json=body).json()["ids"]
    states = fleet3.wait_done(ids)
    assert {s["status"] for s in states.values()} == {"succeeded"}
    workers = {s["worker"] for s in states.values()}
    assert workers == {w.env["FUSEFLEET_WORKER_NAME"] for w in fleet3.workers}, workers
    for batch_id in {s["batch_id"] for s in states.values()}:
        assert attempts(fleet3, batch_id) == 1


def running_worker(fleet: Fleet, request_id: str) -> str:
    state = fleet.wait_running(request_id, min_step=3)
    return str(state["worker"])


def test_sigterm_mid_batch_finishes_the_batch_before_the_worker_exits(fleet3: Fleet) -> None:
    ids = fleet3.http.post("/v1/requests/batch", json={"requests": [{"prompt": "term", **SLOW}] * 2}).json()["ids"]
    name = running_worker(fleet3, ids[0])
    worker = fleet3.worker_named(name)
    assert worker.process is not None
    os.kill(worker.process.pid, signal.SIGTERM)  # like `docker stop`: the main process only
    states = fleet3.wait_done(ids)
    assert {s["status"] for s in states.values()} == {"succeeded"}
    assert {s["worker"] for s in states.values()} == {name}
    finished = {rid: s["finished_at"] for rid, s in states.items()}
    wait_for(lambda: not worker.alive(), 60, "the worker to exit after its batch")
    assert attempts(fleet3, states[ids[0]]["batch_id"]) == 1
    assert {rid: fleet3.get(rid)["finished_at"] for rid in ids} == finished  # ended once
    worker.start()
    wait_for(lambda: fleet3.redis.zscore(fleet3.keys.workers, name) is not None, 120, "the worker to come back")


def test_sigkill_mid_batch_reruns_it_on_another_worker(fleet3: Fleet) -> None:
    ids = fleet3.http.post("/v1/requests/batch", json={"requests": [{"prompt": "kill", **SLOW}] * 2}).json()["ids"]
    name = running_worker(fleet3, ids[0])
    victim = fleet3.worker_named(name)
    victim.kill()  # main process and its pool child, no chance to clean up
    states = fleet3.wait_done(ids, timeout=LOCK_TTL_S + 60)
    assert {s["status"] for s in states.values()} == {"succeeded"}
    rescuers = {s["worker"] for s in states.values()}
    assert name not in rescuers
    # the lost run is split (claim.lua): each request re-ran alone, as attempts 2 and 3
    assert attempts(fleet3, states[ids[0]]["batch_id"]) == 3
    victim.start()
