"""A sharded fleet's schedulers, real processes: two models in two shards (``FUSEFLEET_MODEL_SHARDS``), TWO scheduler
processes and one worker per shard (the fleet's settings plus ``FUSEFLEET_WORKER_MODELS``: its shard's model), the
simulated GPU runner. A lone scheduler leads both shards; a second one started, the first hands one shard's lease
back and the two lead one shard each (the shards' leases carry different tokens), both shards' batches running;
SIGKILL the scheduler leading one shard: the other takes its lease within the lease TTL and one renewal, and that
shard's batches keep running.
Requests go in through one api of the fleet's settings (``api.shard_router``), each to its model's shard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis

from shared.keys import RedisKeys
from shared.shards import shard_mark
from tests.support.fleet import TERMINAL, base_env, new_prefix
from tests.support.processes import Service, api_up, wait_for
from tests.support.redis_server import RedisServer, free_port

LEASE_MS = 1500
SHARD_OF = {"m1": "s1", "m2": "s2"}
ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    "FUSEFLEET_SIM_BASE_MS": "200",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_MODELS": "m1=demo:stable-diffusion,m2=demo:pixart",
    "FUSEFLEET_MODEL_SHARDS": ",".join(f"{model}={shard}" for model, shard in SHARD_OF.items()),
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "50",
    "FUSEFLEET_SCHEDULER_LEASE_MS": str(LEASE_MS),
}


class ShardedFleet:
    """The processes of the test's fleet, and where each shard's keys and api are."""

    def __init__(self, redis_url: str, log_dir: Path) -> None:
        self.prefix = new_prefix("shards")
        self.env = {**base_env(redis_url, self.prefix), **ENV}
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.log_dir = log_dir
        self.services: list[Service] = []
        self.schedulers = [self._service(f"scheduler{i}", ["scheduler"], self.env) for i in (1, 2)]
        for model, shard in SHARD_OF.items():
            worker_env = {**self.env, "FUSEFLEET_WORKER_MODELS": model, "FUSEFLEET_WORKER_NAME": f"w-{shard}@x"}
            self._service(f"worker-{shard}", ["worker"], worker_env)
        port = free_port()
        self._service("api", ["api", "--port", str(port)], self.env)
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def _service(self, name: str, command: list[str], env: dict[str, str]) -> Service:
        service = Service.fusefleet(name, command, env, self.log_dir)
        self.services.append(service)
        return service

    def keys(self, shard: str) -> RedisKeys:
        return RedisKeys(f"{self.prefix}:{shard}")

    def lease(self, shard: str) -> str:
        """The token of ``shard``'s scheduler lease: the process leading it ('' while none does)."""
        return str(self.redis.get(self.keys(shard).scheduler_lease) or "")

    def start(self) -> ShardedFleet:
        """Start every process but the second scheduler."""
        for service in self.services:
            if service is not self.schedulers[1]:
                service.start()
        wait_for(partial(api_up, str(self.api.base_url)), 60, f"the api (logs in {self.log_dir})")
        for shard in SHARD_OF.values():
            workers = self.keys(shard).workers
            wait_for(partial(self.redis.zcard, workers), 60, f"the worker of {shard} (logs in {self.log_dir})")
        return self

    def stop(self) -> None:
        self.api.close()
        for service in self.services:
            service.stop()
        self.redis.close()

    def submit(self, model: str, n: int = 1) -> list[str]:
        """``n`` requests of ``model`` through the api: their ids (each with its shard's mark)."""
        body = {"prompt": "a red fox", "model": model, "width": 64, "height": 64, "num_inference_steps": 4}
        ids = []
        for _ in range(n):
            response = self.api.post("/v1/requests", json=body)
            assert response.status_code == 202, response.text
            ids.append(str(response.json()["id"]))
            assert ids[-1].startswith(shard_mark(SHARD_OF[model])), ids[-1]
        return ids

    def wait_done(self, ids: list[str], timeout: float = 30) -> dict[str, str]:
        statuses: dict[str, str] = {}

        def done() -> bool:
            for request_id in ids:
                if statuses.get(request_id) not in TERMINAL:
                    statuses[request_id] = self.api.get(f"/v1/requests/{request_id}").json()["status"]
            return all(status in TERMINAL for status in statuses.values())

        wait_for(done, timeout, f"{len(ids)} requests to finish (logs in {self.log_dir})", interval=0.1)
        return statuses


@pytest.fixture
def fleet(redis_server: RedisServer, tmp_path: Path) -> Iterator[ShardedFleet]:
    one = ShardedFleet(redis_server.url, tmp_path)
    try:
        yield one.start()
    finally:
        one.stop()


def test_two_schedulers_lead_one_shard_each_and_one_takes_over_the_others_when_it_is_killed(
    fleet: ShardedFleet,
) -> None:
    shards = sorted(SHARD_OF.values())

    def leaders() -> set[str]:
        return {fleet.lease(shard) for shard in shards}

    wait_for(lambda: len(leaders()) == 1 and "" not in leaders(), 30, f"scheduler1 to lead both (in {fleet.log_dir})")
    alone = fleet.submit("m1", 2) + fleet.submit("m2", 2)
    assert set(fleet.wait_done(alone).values()) == {"succeeded"}
    fleet.schedulers[1].start()
    wait_for(lambda: len(leaders()) == 2 and "" not in leaders(), 30, f"one shard each (logs in {fleet.log_dir})")
    assert "hands its lease back" in fleet.schedulers[0].log()
    processes = fleet.redis.zrange(RedisKeys(fleet.prefix).scheduler_processes, 0, -1)
    assert sorted(processes) == sorted(fleet.lease(shard) for shard in shards), "each announced itself"
    before = fleet.submit("m1", 3) + fleet.submit("m2", 3)
    assert set(fleet.wait_done(before).values()) == {"succeeded"}

    killed = fleet.schedulers[0]
    shard = next(s for s in shards if f"{fleet.lease(s)[:8]} is active" in killed.log())
    survivor = fleet.lease(next(s for s in shards if s != shard))
    killed.kill()
    killed_at = time.monotonic()
    wait_for(lambda: fleet.lease(shard) == survivor, 10, f"the survivor to take {shard}'s lease")
    took_s = time.monotonic() - killed_at
    bound_s = LEASE_MS / 1000 * (1 + 1 / 3)  # the killed lease lapses within its TTL; a standby tries every TTL / 3
    assert took_s < bound_s + 1.0, f"took {took_s:.2f} s (bound {bound_s:.2f} s + 1 s of a loaded host's jitter)"
    assert fleet.lease(next(s for s in shards if s != shard)) == survivor, "it kept its own shard"

    after = fleet.submit("m1", 3) + fleet.submit("m2", 3)
    assert set(fleet.wait_done(after).values()) == {"succeeded"}, f"logs in {fleet.log_dir}"

    shown = subprocess.run(
        [sys.executable, "-m", "fusefleet", "status"], env={**os.environ, **fleet.env}, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "fleet: 2 shards, 0 waiting" in shown.stdout and "16 requests accepted" in shown.stdout, shown.stdout
    for model, shard in SHARD_OF.items():
        assert f"shard '{shard}' (models: {model}):\n" in shown.stdout, shown.stdout
    s1, s2 = shown.stdout.split("shard 's2'")
    assert "w-s1@x: live" in s1 and "w-s2@x" not in s1 and "w-s2@x: live" in s2, "each shard lists its own worker"
