"""A real fleet for integration tests: a private Redis, `fusefleet api`, `fusefleet scheduler` and a
`fusefleet worker` process with the tiny demo model (built once per session) and a test LoRA adapter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gpu_worker.demo_model import ensure_demo_model
from shared.keys import RedisKeys
from tests.support.lora import make_test_lora
from tests.support.processes import Service, wait_for
from tests.support.redis_server import RedisServer, free_port

TERMINAL = {"succeeded", "failed", "aborted"}
LORA_NAME = "sparkle"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    ensure_demo_model(cache)
    return cache


@pytest.fixture(scope="session")
def lora_dir(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("loras")
    make_test_lora(ensure_demo_model(model_cache), folder, LORA_NAME, seed=7)
    return folder


class Fleet:
    """The running services plus helpers to talk to them."""

    def __init__(self, env: dict[str, str], log_dir: Path, redis_url: str, prefix: str, workers: int = 1) -> None:
        self.env = env
        self.log_dir = log_dir
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.keys = RedisKeys(prefix)
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.api = Service.fusefleet("api", ["api", "--port", str(port)], env, log_dir)
        self.scheduler = self.new_scheduler("scheduler")
        self.workers = [
            Service.fusefleet(
                f"worker{i}", ["worker"], {**env, "FUSEFLEET_WORKER_NAME": f"worker{i}@{prefix}"}, log_dir
            )
            for i in range(workers)
        ]
        self.http = httpx.Client(base_url=self.base_url, timeout=30)

    def new_scheduler(self, name: str) -> Service:
        return Service.fusefleet(name, ["scheduler"], self.env, self.log_dir)

    def start(self) -> Fleet:
        for worker in self.workers:
            worker.start()
        self.api.start()
        self.scheduler.start()
        wait_for(self._api_up, 60, f"the api (log: {self.api.log_path})")
        wait_for(
            lambda: self.redis.zcard(self.keys.workers) >= len(self.workers), 180, f"workers (logs in {self.log_dir})"
        )
        return self

    def worker_named(self, name: str) -> Service:
        return next(w for w in self.workers if w.env["FUSEFLEET_WORKER_NAME"] == name)

    def _api_up(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.http.close()
        for service in (self.scheduler, self.api, *self.workers):
            service.stop()

    # --- API helpers ---------------------------------------------------------------------------------------
    def submit(self, **params: Any) -> str:
        body = {"prompt": "a red fox", "width": 64, "height": 64, "num_inference_steps": 4, **params}
        response = self.http.post("/v1/requests", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def get(self, request_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/requests/{request_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_done(self, ids: list[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {}

        def all_done() -> bool:
            for rid in ids:
                if states.get(rid, {}).get("status") not in TERMINAL:
                    states[rid] = self.get(rid)
            return all(state["status"] in TERMINAL for state in states.values()) and len(states) == len(ids)

        wait_for(all_done, timeout, f"{len(ids)} requests to finish (logs in {self.log_dir})", interval=0.1)
        return states

    def wait_running(self, request_id: str, min_step: int, timeout: float = 60) -> dict[str, Any]:
        """Wait until the request reports step ``min_step``; fail at once if it ends instead."""

        def progressed() -> dict[str, Any] | None:
            state = self.get(request_id)
            assert state["status"] not in TERMINAL, f"request ended before running: {state}"
            return state if state["progress"]["step"] >= min_step else None

        return dict(wait_for(progressed, timeout, f"request {request_id} to reach step {min_step}"))  # type: ignore[arg-type]

    def image(self, request_id: str, index: int = 0) -> bytes:
        response = self.http.get(f"/v1/requests/{request_id}/images/{index}")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "image/png"
        return response.content


def fleet_env(redis_url: str, prefix: str, model_cache: Path, lora_dir: Path) -> dict[str, str]:
    return {
        "FUSEFLEET_REDIS_URL": redis_url,
        "FUSEFLEET_KEY_PREFIX": prefix,
        "FUSEFLEET_QUEUE_NAME": f"{prefix}.batches",
        "FUSEFLEET_MAX_NUM_SEQS": "4",
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
        "FUSEFLEET_MODEL_CACHE_DIR": str(model_cache),
        "FUSEFLEET_LORA_DIR": str(lora_dir),
        "FUSEFLEET_RUNNER": "tests.support.runners:ExplodingRunner",
        "FUSEFLEET_TORCH_THREADS": "2",
        "FUSEFLEET_MAX_INFERENCE_STEPS": "5000",
        "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    }


@contextmanager
def running_fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, log_dir: Path, workers: int = 1, **env: str
) -> Iterator[Fleet]:
    """A fleet under a fresh key prefix and queue; ``env`` overrides FUSEFLEET_* variables."""
    prefix = f"ff-test-{uuid.uuid4().hex[:8]}"
    full_env = {**fleet_env(redis_server.url, prefix, model_cache, lora_dir), **env}
    fleet = Fleet(full_env, log_dir, redis_server.url, prefix, workers=workers)
    try:
        yield fleet.start()
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path_factory.mktemp("fleet-logs")) as one:
        yield one
