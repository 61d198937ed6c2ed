"""A real local Redis Cluster for tests: three masters with one replica each, on free ports in a folder of its own.

``LocalRedisCluster(folder).start()`` starts six ``redis-server --cluster-enabled yes`` processes, joins them with
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and returns once every node reports
``cluster_state:ok`` and each master has its replica attached; ``url`` is a seed node (what
``FUSEFLEET_REDIS_URL`` takes with ``FUSEFLEET_REDIS_CLUSTER=true``). ``stop()`` ends every node. Each node is a
``ClusterNode`` that a test may ``kill()`` (SIGKILL) and ``start()`` again on its port and folder.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from fusefleet.valkey import EmbeddedValkey

BUS_PORT_OFFSET = 10000  # Redis Cluster's bus listens on port + 10000
NODE_TIMEOUT_MS = 2000  # how long a master may be unreachable before its replica takes over
START_TIMEOUT_S = 60.0  # a loaded 2-core CI host: replicas' first syncs and gossip take their time


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A port free a moment ago whose cluster bus port (``port + 10000``) was free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + BUS_PORT_OFFSET <= 65535 and _free(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def cluster_binaries() -> tuple[str, str] | None:
    """``redis-server`` and ``redis-cli`` on PATH, or None when either is missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return (server, cli) if server and cli else None


class ClusterNode(EmbeddedValkey):
    """One cluster-enabled ``redis-server`` (its ``nodes.conf`` in its folder, so a restart rejoins the cluster)."""

    def __init__(self, data_dir: Path, server: str) -> None:
        super().__init__(data_dir, port_picker=free_cluster_port)
        self._server = server

    def argv(self) -> list[str]:
        return [
            self._server,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            *super().argv()[1:],
        ]


class LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each; ``url`` is the first master's (a seed node)."""

    def __init__(self, data_dir: Path, *, masters: int = 3, replicas: int = 1) -> None:
        binaries = cluster_binaries()
        if binaries is None:
            raise RuntimeError("a Redis Cluster needs redis-server and redis-cli on PATH (apt-get install redis)")
        server, self._cli = binaries
        self.masters, self.replicas = masters, replicas
        self.nodes = [ClusterNode(data_dir / f"node{i}", server) for i in range(masters * (1 + replicas))]
        self.url = self.nodes[0].url

    @property
    def addresses(self) -> list[str]:
        """Each node's ``host:port``, in order (the first ``masters`` become the masters when joined)."""
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalRedisCluster:
        """Start the nodes, join them (``redis-cli --cluster create``) and wait until the cluster is ok."""
        try:
            self.start_nodes()
            subprocess.run(
                [self._cli, "--cluster", "create", *self.addresses, "--cluster-replicas", str(self.replicas)]
                + ["--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=timeout_s,
            )
            self.wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_nodes(self) -> LocalRedisCluster:
        """Start every node, not yet joined (for a test that joins them its own way, then ``wait_ok``)."""
        try:
            for node in self.nodes:
                node.start()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every live node says ``cluster_state:ok`` and ``masters`` masters each have ``replicas`` replicas
        connected; RuntimeError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster is not ok after {timeout_s} s:\n{self.describe()}")
            time.sleep(0.2)

    def describe(self) -> str:
        """Each node's state as it says it (cluster state, role, replicas and their link states, the last lines of
        its log): what a timed-out ``wait_ok`` prints, so a cluster that did not converge says where it stuck."""
        lines = []
        for node in self.nodes:
            head = f"node :{node.port} ({'alive' if node.alive() else 'dead'})"
            try:
                with redis.Redis(port=node.port, decode_responses=True, socket_timeout=2) as client:
                    state = client.cluster("info")["cluster_state"]
                    info = client.info("replication")
                replicas = [info.get(f"slave{i}", {}).get("state") for i in range(info.get("connected_slaves", 0))]
                head += f" cluster_state={state} role={info['role']} replicas={replicas}"
                if info["role"] == "slave":
                    head += f" link={info.get('master_link_status')} master=:{info.get('master_port')}"
            except redis.RedisError as error:
                head += f" unreachable: {error}"
            tail = node.log_path.read_text(errors="replace").splitlines()[-4:] if node.log_path.exists() else []
            lines.append("\n    ".join([head, *tail]))
        return "\n".join(lines)

    def _ok(self) -> bool:
        masters = 0
        for node in self.nodes:
            if not node.alive():
                continue
            with redis.Redis(port=node.port, decode_responses=True, socket_timeout=2) as client:
                try:
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False
                    info = client.info("replication")
                except redis.RedisError:
                    return False
            if info["role"] == "master":
                masters += 1
                linked = [info.get(f"slave{i}", {}) for i in range(info["connected_slaves"])]
                if sum(1 for replica in linked if replica.get("state") == "online") < self.replicas:
                    return False
        return masters == self.masters

    def client(self) -> RedisCluster:
        """A cluster client (string replies) on the seed node."""
        return RedisCluster.from_url(self.url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2)

    def master_of(self, key: str) -> ClusterNode:
        """The node that holds ``key``'s slot now."""
        with self.client() as client:
            owner = client.get_node_from_key(key)
        return next(node for node in self.nodes if node.port == owner.port)

    def serving(self, key: str, *, instead_of: ClusterNode) -> bool:
        """Whether a live node other than ``instead_of`` is the master of ``key``'s slot, as a live node says while
        it reports ``cluster_state:ok`` (a failover is over)."""
        for node in self.nodes:
            if node is instead_of or not node.alive():
                continue
            with redis.Redis(port=node.port, decode_responses=True, socket_timeout=2) as client:
                try:
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False
                    slot = int(client.cluster("keyslot", key))
                    ranges = client.cluster("slots")
                except redis.RedisError:
                    continue
            owner = next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))
            return owner != instead_of.port and any(n.port == owner and n.alive() for n in self.nodes)
        return False

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
