"""Tiers: tests/unit (pure, fast, no server) and tests/integration (real Redis, real worker processes).

``redis_cluster`` is the session's local Redis Cluster (tests/support/redis_cluster.py), started on first use;
``--redis-cluster`` runs every fleet of the session on it (tests/support/fleet.py's ``run_on_cluster``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import fleet as support_fleet
from tests.support.redis_cluster import LocalRedisCluster, cluster_binaries

# One torch thread in the test process and every process it starts (they inherit the variable; no test sets a count
# of its own): `make test` runs two pytest processes on two cores, each starting workers, and torch's spinning
# thread pools oversubscribed that way slowed a 5 s fleet test to 35-55 s (past its wait in CI), against 7 s here.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-count",
        type=int,
        default=None,
        help="requests of the chaos soak test (tests/chaos/test_soak.py; or FUSEFLEET_SOAK_COUNT)",
    )
    parser.addoption(
        "--redis-cluster",
        action="store_true",
        help="run every fleet on a local Redis Cluster (3 masters, 1 replica each), the session's Redis as its broker",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
    # soak tests (over a minute each) keep CI within its budget: they run only when the -m expression names them
    if "soak" in (config.option.markexpr or ""):
        return
    soaks = [item for item in items if item.get_closest_marker("soak") is not None]
    if soaks:
        config.hook.pytest_deselected(items=soaks)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    if cluster_binaries() is None:
        pytest.skip("a Redis Cluster needs redis-server and redis-cli on PATH (Debian: apt-get install redis-server)")
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session", autouse=True)
def _fleets_on_the_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``--redis-cluster``, every fleet of the session keeps its state on ``redis_cluster``."""
    if not request.config.getoption("--redis-cluster"):
        yield
        return
    support_fleet.run_on_cluster(request.getfixturevalue("redis_cluster").url)
    yield
    support_fleet.run_on_cluster(None)
