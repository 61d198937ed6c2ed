"""A sharded fleet with real processes: two tiny demo models in two shards (``FUSEFLEET_MODEL_SHARDS``), each shard
served by a scheduler and a worker of its own started on the shard's key prefix and queue (a shard is a prefix: the
scheduler and the worker serve it as they serve a fleet), and one api started with the fleet's settings.

Interleaved requests of both models, through the native API (single and batch, a batch spanning both shards) and
the official ``openai`` client, all succeed, each on its shard's worker, with an id carrying its shard's mark; every
key of a request lives under its shard's hash tag only (SCAN), the fleet's own keys hold none; ``GET /v1/models``
lists both models and ``GET /v1/fleet`` both workers and every request. The same fleet runs on a real local Redis
Cluster too (``cluster``), with shard names whose hash tags fall on two different masters: one api serves shards
that live on two nodes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from demo_models import ensure_demo_model
from shared.keys import RedisKeys
from shared.shards import MARK_DIGITS, shard_mark
from tests.integration.conftest import fleet_env
from tests.support.fleet import TERMINAL, base_env, fleet_client, new_prefix
from tests.support.processes import Service, wait_for
from tests.support.redis_cluster import LocalRedisCluster, cluster_binaries
from tests.support.redis_server import RedisServer, free_port

FAMILIES = {"sd": "stable-diffusion", "px": "pixart"}
SHARDS = {"sd": "one", "px": "two"}  # every model in a shard of its own: the fleet's own keys hold no request
SHARD_NAMES = ("one", "two", "three", "four", "five", "six", "seven", "eight")
"""Candidates for the cluster's shard names: the first two whose tags two different masters hold."""
OPENAI = ["px", "sd"]  # the models of the calls through the openai client


@dataclass
class ShardedFleet:
    prefix: str
    http: httpx.Client
    redis: redis.Redis
    workers: dict[str, str]  # model -> its worker's name
    log_dir: Path
    shards: dict[str, str]  # model -> its shard

    def keys(self, shard: str) -> RedisKeys:
        return RedisKeys(f"{self.prefix}:{shard}" if shard else self.prefix)

    def submit(self, model: str, i: int) -> str:
        response = self.http.post("/v1/requests", json=body(model, i))
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def wait_done(self, ids: list[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {}

        def done() -> bool:
            for request_id in ids:
                if states.get(request_id, {}).get("status") not in TERMINAL:
                    states[request_id] = self.http.get(f"/v1/requests/{request_id}", params={"wait_s": 1}).json()
            return all(state.get("status") in TERMINAL for state in states.values())

        wait_for(done, timeout, f"{len(ids)} requests to finish (logs in {self.log_dir})", interval=0.05)
        return states


def beating(client: redis.Redis, keys: RedisKeys, worker: str) -> bool:
    return client.zscore(keys.workers, worker) is not None


def body(model: str, i: int) -> dict[str, Any]:
    return {"prompt": f"a fox {i}", "model": model, "width": 64, "height": 64, "num_inference_steps": 2, "seed": i}


def on_two_masters(cluster: LocalRedisCluster, prefix: str) -> dict[str, str]:
    """Each model's shard, named so that the two shards' hash tags fall on two different masters of ``cluster``."""
    first, *others = SHARD_NAMES
    node = cluster.master_of(RedisKeys(f"{prefix}:{first}").requests)
    second = next(name for name in others if cluster.master_of(RedisKeys(f"{prefix}:{name}").requests) is not node)
    return dict(zip(FAMILIES, (first, second), strict=True))


@pytest.fixture(scope="module", params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def fleet(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    model_cache: Path,
    lora_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ShardedFleet]:
    for family in FAMILIES.values():
        ensure_demo_model(model_cache, family)  # built once, before the workers load them
    logs = tmp_path_factory.mktemp("shards-fleet-logs")
    prefix = new_prefix("shards")
    shards = dict(SHARDS)
    cluster_url = None
    if request.param == "cluster":
        if cluster_binaries() is None:
            pytest.skip("needs redis-server and redis-cli (apt-get install redis)")
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        cluster_url, shards = cluster.url, on_two_masters(cluster, prefix)
    env = {
        **fleet_env(model_cache, lora_dir),
        **base_env(redis_server.url, prefix, cluster_url=cluster_url),
        "FUSEFLEET_RUNNER": "gpu_worker.diffusers_runner:DiffusersRunner",
        "FUSEFLEET_MODELS": ",".join(f"{name}=demo:{family}" for name, family in FAMILIES.items()),
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "50",
    }
    port = free_port()
    services = [
        Service.fusefleet(
            "api",
            ["api", "--port", str(port)],
            {**env, "FUSEFLEET_MODEL_SHARDS": ",".join(f"{m}={s}" for m, s in shards.items())},
            logs,
        )
    ]
    workers: dict[str, str] = {}
    for model, shard in shards.items():  # a shard's scheduler and worker: the fleet's settings inside the shard
        inside = {
            **env,
            "FUSEFLEET_KEY_PREFIX": f"{prefix}:{shard}",
            "FUSEFLEET_QUEUE_NAME": f"{env['FUSEFLEET_QUEUE_NAME']}:{shard}",
        }
        workers[model] = f"{model}-worker@{prefix}"
        services.append(Service.fusefleet(f"scheduler-{shard}", ["scheduler"], inside, logs))
        worker_env = {**inside, "FUSEFLEET_WORKER_MODELS": model, "FUSEFLEET_WORKER_NAME": workers[model]}
        services.append(Service.fusefleet(f"worker-{shard}", ["worker"], worker_env, logs))
    client = fleet_client(env["FUSEFLEET_REDIS_URL"], cluster=env.get("FUSEFLEET_REDIS_CLUSTER") == "true")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    one = ShardedFleet(prefix, http, client, workers, logs, shards)
    try:
        for service in services:  # all at once: the workers load side by side
            service.start()

        def up() -> bool:
            try:
                return http.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, f"the api (logs in {logs})")
        for model, shard in shards.items():
            wait_for(
                partial(beating, client, one.keys(shard), workers[model]),
                120,
                f"{model}'s worker to beat in shard {shard} (logs in {logs})",
            )
        yield one
    finally:
        http.close()
        for service in services:
            service.stop()
        client.close()


def test_models_lists_both_shards_models(fleet: ShardedFleet) -> None:
    listed = fleet.http.get("/v1/models").json()["data"]
    assert [(model["id"], model["workers"]) for model in listed] == [("sd", 1), ("px", 1)]


def test_interleaved_requests_of_both_shards_succeed_and_live_in_their_shard(fleet: ShardedFleet) -> None:
    order = ["sd", "px", "px", "sd"]
    with (
        openai.OpenAI(base_url=str(fleet.http.base_url) + "/v1", api_key="unused", max_retries=0, timeout=60) as client,
        ThreadPoolExecutor(4) as pool,
    ):
        calls = [
            pool.submit(
                client.images.with_raw_response.generate,
                prompt=f"a heron {i}",
                model=model,
                size="64x64",
                extra_body={"seed": 40 + i, "num_inference_steps": 2},
            )
            for i, model in enumerate(OPENAI)
        ]
        batch = fleet.http.post("/v1/requests/batch", json={"requests": [body(m, i) for i, m in enumerate(order)]})
        assert batch.status_code == 202, batch.text
        ids: list[str] = batch.json()["ids"] + [fleet.submit(model, 10 + i) for i, model in enumerate(order[:2])]
        answers = [call.result() for call in calls]
    for answer in answers:
        [image] = answer.parse().data or []
        assert base64.b64decode(image.b64_json or "").startswith(b"\x89PNG")
        ids.append(answer.headers["x-request-id"])
    models = [*order, *order[:2], *OPENAI]
    states = fleet.wait_done(ids)
    for request_id, model in zip(ids, models, strict=True):
        state, shard = states[request_id], fleet.shards[model]
        assert (state["status"], state["params"]["model"]) == ("succeeded", model), state
        assert state["worker"] == fleet.workers[model], f"{request_id} of {model} ran on {state['worker']}"
        assert request_id[:MARK_DIGITS] == shard_mark(shard)
        png = fleet.http.get(f"/v1/requests/{request_id}/images/0")
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
        found = set(fleet.redis.scan_iter(match=f"*{request_id}*", count=1000))
        assert fleet.keys(shard).request(request_id) in found
        tag = fleet.keys(shard).tag
        assert found and all(key.startswith(tag + ":") for key in found), (tag, found)
    home = fleet.keys("")
    assert not list(fleet.redis.scan_iter(match=home.request("*"), count=1000)), "the fleet's own keys hold none"
    view = fleet.http.get("/v1/fleet").json()
    assert sorted(worker["name"] for worker in view["workers"]) == sorted(fleet.workers.values())
    assert view["requests_finished"]["succeeded"] >= len(ids) and view["queue_depth"] == 0
