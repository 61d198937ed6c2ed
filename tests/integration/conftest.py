"""A real fleet for integration tests: a private Redis, `fusefleet api`, `fusefleet scheduler` and a
`fusefleet worker` process with the tiny demo model (built once per session) and a test LoRA adapter."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from demo_models import ensure_demo_model
from gpu_worker.diffusers_runner import DiffusersRunner
from tests.support import fleet as support_fleet
from tests.support.fleet import TERMINAL, Fleet
from tests.support.lora import make_test_lora
from tests.support.redis_server import RedisServer
from tests.support.solo import solo_runner_of

__all__ = ["LORA_NAME", "TERMINAL", "Fleet", "fleet_env", "running_fleet"]

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


def fleet_env(model_cache: Path, lora_dir: Path) -> dict[str, str]:
    return {
        "FUSEFLEET_MAX_NUM_SEQS": "4",
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
        "FUSEFLEET_MODEL_CACHE_DIR": str(model_cache),
        "FUSEFLEET_LORA_DIR": str(lora_dir),
        "FUSEFLEET_RUNNER": "tests.support.runners:ExplodingRunner",
        "FUSEFLEET_MAX_INFERENCE_STEPS": "5000",
        "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    }


@contextmanager
def running_fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, log_dir: Path, workers: int = 1, **env: str
) -> Iterator[Fleet]:
    """A fleet under a fresh key prefix and queue; ``env`` overrides FUSEFLEET_* variables."""
    with support_fleet.running_fleet(
        redis_server.url, log_dir, {**fleet_env(model_cache, lora_dir), **env}, workers=workers
    ) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with running_fleet(redis_server, model_cache, lora_dir, tmp_path_factory.mktemp("fleet-logs")) as one:
        yield one


@pytest.fixture(scope="module")
def solo_runner(model_cache: Path, lora_dir: Path) -> DiffusersRunner:
    """The real runner on the demo model in the test process: what a request gives when run alone."""
    return solo_runner_of(model_cache, lora_dir)
