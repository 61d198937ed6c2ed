"""Fixtures of the chaos suite: a private Redis per test and fleets of real processes with placeholder runners.

Every test gets its own Redis server (it may be killed or stopped), its own key prefix and Celery queue, and its
logs in its own tmp folder; on failure the teardown prints where the logs are. Every process is stopped in a
``finally`` (ExitStack), whatever the test did to it.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import pytest

from fusefleet.valkey import AppendFsync
from tests.support.fleet import Fleet, new_prefix, running_fleet
from tests.support.redis_server import RedisServer

SOAK_COUNT_DEFAULT = 20_000

CHAOS_ENV = {
    "FUSEFLEET_RUNNER": "tests.support.runners:ChaosRunner",
    "FUSEFLEET_SIM_BASE_MS": "0",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "20",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_WORKER_HEARTBEAT_S": "0.5",
    "FUSEFLEET_WORKER_TTL_S": "3",
    "FUSEFLEET_BATCH_LOCK_TTL_S": "3",
    "FUSEFLEET_BATCH_CLAIM_TIMEOUT_S": "5",
    "FUSEFLEET_MAX_BATCH_ATTEMPTS": "3",
    "FUSEFLEET_REDIS_SOCKET_TIMEOUT_S": "2",
    "FUSEFLEET_REDIS_OUTAGE_RETRY_S": "30",
    "FUSEFLEET_MAX_INFERENCE_STEPS": "200",
}
"""Short timeouts so every recovery path runs within seconds; tests override what their scenario needs."""


def step_mode_env(step_ms: int) -> dict[str, str]:
    """A step-mode fleet of the simulated denoiser, ``step_ms`` a step (its base over 20 steps), each request
    scheduled at once."""
    return {
        "FUSEFLEET_STEP_MODE": "1",
        "FUSEFLEET_SIM_BASE_MS": str(step_ms * 20),
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "0",
    }


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def soak_count(request: pytest.FixtureRequest) -> int:
    option = request.config.getoption("soak_count", default=None)
    if option:
        return int(option)
    return int(os.environ.get("FUSEFLEET_SOAK_COUNT", SOAK_COUNT_DEFAULT))


class RedisFactory(Protocol):
    def __call__(self, *, persistent: bool = False, appendfsync: AppendFsync = "everysec") -> RedisServer: ...


class FleetFactory(Protocol):
    def __call__(self, server: RedisServer, *, workers: int = 1, **env: str) -> Fleet: ...


@pytest.fixture
def chaos_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExitStack]:
    """Everything a test starts; unwound (processes first, Redis last) whatever happened."""
    stack = ExitStack()
    logs: list[Path] = []
    request.node.stash[_LOGS] = logs
    try:
        yield stack
    finally:
        stack.close()
        if request.node.stash.get(_FAILED, False):
            print(f"\nchaos logs of {request.node.name}: " + ", ".join(str(p) for p in logs))


_LOGS = pytest.StashKey[list[Path]]()


@pytest.fixture
def chaos_redis(request: pytest.FixtureRequest, chaos_stack: ExitStack, tmp_path: Path) -> RedisFactory:
    """Start a private Redis (valkey) server; stopped (resumed first if paused) at teardown."""

    def start(*, persistent: bool = False, appendfsync: AppendFsync = "everysec") -> RedisServer:
        data_dir = tmp_path / f"redis-{len(request.node.stash[_LOGS])}"
        server = RedisServer(data_dir, persistent=persistent, appendfsync=appendfsync)
        chaos_stack.callback(server.stop)
        request.node.stash[_LOGS].append(server.log_path)
        return server.start()

    return start


@pytest.fixture
def chaos_fleet(request: pytest.FixtureRequest, chaos_stack: ExitStack, tmp_path: Path) -> FleetFactory:
    """Start a fleet on ``server`` with ``CHAOS_ENV`` plus ``env``; stopped at teardown."""

    def start(server: RedisServer, *, workers: int = 1, **env: str) -> Fleet:
        log_dir = tmp_path / f"fleet-{len(request.node.stash[_LOGS])}"
        log_dir.mkdir()
        request.node.stash[_LOGS].append(log_dir)
        prefix = new_prefix("chaos")
        full_env = {**CHAOS_ENV, "FUSEFLEET_MODEL_CACHE_DIR": str(tmp_path / "model-cache"), **env}
        return chaos_stack.enter_context(
            running_fleet(
                server.url, log_dir, full_env, prefix=prefix, workers=workers, redis_socket_timeout_s=5, stop_timeout=10
            )
        )

    return start
