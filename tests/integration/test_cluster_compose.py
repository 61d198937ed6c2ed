"""docker-compose.yml's ``cluster`` profile: six cluster-enabled Redis nodes and a one-shot ``redis-cluster-init``
that joins them, with the fleet's state on the cluster and the ``redis`` service kept as its Celery broker. Checked
as compose would resolve the file (``tests/integration/test_compose.py``'s interpolation), and the init's command
run here as written against six local cluster-enabled ``redis-server`` processes (their addresses in place of the
compose service names: the one host-specific part)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.settings import Settings
from tests.integration.test_compose import (
    COMPOSE,
    FUSEFLEET_SERVICES,
    compose,
    fleet_settings,
    interpolate,
    service_env,
)
from tests.support.redis_cluster import LocalRedisCluster, cluster_binaries

pytestmark = pytest.mark.cluster
NODES = [f"redis-node-{i}" for i in range(1, 7)]
INIT = "redis-cluster-init"


def cluster_env() -> dict[str, str]:
    """The .env the file's header gives for the cluster profile (its ``NAME=value`` words, as written)."""
    line = next(line for line in COMPOSE.read_text().splitlines() if "FUSEFLEET_REDIS_CLUSTER=true" in line)
    return dict(word.split("=", 1) for word in line.lstrip("# ").split())


def test_the_cluster_profile_adds_six_nodes_and_a_one_shot_join_inside_the_network_only() -> None:
    services = compose()["services"]
    for name, service in services.items():  # the profile's services only: a plain `up` stays as it was
        assert ("cluster" in service.get("profiles", [])) == (name in (*NODES, INIT)), name
    volumes = set()
    for name in NODES:
        node = services[name]
        command = node["command"]
        assert command[0] == "redis-server" and command[command.index("--cluster-enabled") + 1] == "yes", name
        assert "--appendonly" in command and "everysec" in command and "noeviction" in command, name
        assert node["healthcheck"]["test"] and "ports" not in node, name
        (volume,) = node["volumes"]
        assert volume.endswith(":/data"), name
        volumes.add(volume.split(":")[0])
    assert len(volumes) == len(NODES), "each node keeps its data and nodes.conf in a volume of its own"
    assert volumes <= set(compose()["volumes"])
    init = services[INIT]
    assert init["restart"] == "no" and "ports" not in init
    assert set(init["depends_on"]) == set(NODES)
    assert all(dep == {"condition": "service_healthy"} for dep in init["depends_on"].values())
    assert service_env(init)["REDIS_CLUSTER_NODES"].split() == [f"{name}:6379" for name in NODES]
    for name in FUSEFLEET_SERVICES:
        wait = services[name]["depends_on"][INIT]
        assert wait == {"condition": "service_completed_successfully", "required": False}, name


def test_the_fleet_keeps_one_redis_unless_the_env_names_the_cluster() -> None:
    services = compose()["services"]
    env = cluster_env()
    assert env["FUSEFLEET_REDIS_URL"].startswith("redis://redis-node-1:6379")
    for name in FUSEFLEET_SERVICES:
        plain = fleet_settings(service_env(services[name]))
        assert not plain.redis_cluster and plain.redis_url == "redis://redis:6379/0", name
        on_cluster: Settings = fleet_settings(service_env(services[name], env))
        assert on_cluster.redis_cluster and on_cluster.redis_url == env["FUSEFLEET_REDIS_URL"], name
        assert on_cluster.celery_broker_url == "redis://redis:6379/0", "the redis service stays as the broker"
    with pytest.raises(ValueError, match="broker_url"):  # the services refuse a cluster without a broker of its own
        fleet_settings(service_env(services["scheduler"], {**env, "FUSEFLEET_BROKER_URL": ""}))


def run_init(addresses: list[str]) -> subprocess.CompletedProcess[str]:
    """``redis-cluster-init``'s entrypoint and command as its container runs them, on these node addresses."""
    spec: dict[str, Any] = compose()["services"][INIT]
    argv = [interpolate(part) for part in [*spec["entrypoint"], *spec["command"]]]
    env = {**service_env(spec), "REDIS_CLUSTER_NODES": " ".join(addresses), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(cluster_binaries() is None, reason="needs redis-server and redis-cli (apt-get install redis)")
def test_the_init_joins_the_nodes_once_and_leaves_a_formed_cluster_alone(tmp_path: Path) -> None:
    cluster = LocalRedisCluster(tmp_path).start_nodes()
    try:
        first = run_init(cluster.addresses)
        assert first.returncode == 0, first.stdout + first.stderr
        cluster.wait_ok()  # three masters with a replica each, every node ok
        with redis.Redis(port=cluster.nodes[0].port, decode_responses=True) as client:
            before = sorted(node["node_id"] for node in client.cluster("nodes").values())
            assert int(client.cluster("info")["cluster_slots_assigned"]) == 16384
        again = run_init(cluster.addresses)  # a restart of the profile: the formed cluster is kept as it is
        assert again.returncode == 0 and "already formed" in again.stdout, again.stdout + again.stderr
        with redis.Redis(port=cluster.nodes[0].port, decode_responses=True) as client:
            after = sorted(node["node_id"] for node in client.cluster("nodes").values())
        assert after == before and len(after) == len(NODES)
    finally:
        cluster.stop()


@pytest.mark.skipif(cluster_binaries() is None, reason="needs redis-server and redis-cli (apt-get install redis)")
def test_the_init_fails_saying_why_when_no_node_answers(tmp_path: Path) -> None:
    nowhere = [f"127.0.0.1:{port}" for port in (1, 2, 3, 4, 5, 6)]
    failed = run_init(nowhere)
    assert failed.returncode != 0
    assert re.search(r"[Cc]ould not connect|Connection refused", failed.stdout + failed.stderr)
