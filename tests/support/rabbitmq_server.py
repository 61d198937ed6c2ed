"""A private RabbitMQ node for a test that stops or kills its broker (the session's shared RabbitMQ must not be
touched): its own node name, AMQP and distribution ports, data and logs in a tmp folder, no plugins.

``RabbitMQServer(folder).start()`` waits until the node takes AMQP logins; ``kill()`` (SIGKILL, a crash) or
``stop()`` ends it, and ``start()`` again brings it back on the same port with the same data (durable queues and
their persistent messages survive). Starting a node takes 10-30 s on a busy 2-core machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from kombu import Connection

from tests.support.redis_server import free_port

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQCTL = RABBITMQ_SERVER.with_name("rabbitmqctl")


class RabbitMQServer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"fftest{uuid.uuid4().hex[:8]}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.log_path = folder / "rabbitmq.out"
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        # guest may log in only from localhost: the tests connect to 127.0.0.1
        (folder / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (folder / "enabled_plugins").write_text("[].\n")

    @staticmethod
    def available() -> bool:
        return RABBITMQ_SERVER.exists()

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.folder),  # its own Erlang cookie
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "no-env.conf"),  # not /etc/rabbitmq's
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self, timeout: float = 90.0) -> RabbitMQServer:
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            [str(RABBITMQ_SERVER)], env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited {self.process.returncode}; log: {self.log_path}")
            try:
                with Connection(self.url, connect_timeout=1) as connection:
                    connection.connect()  # one attempt, no backoff: the node is up when this returns
                return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        raise TimeoutError(f"rabbitmq-server did not take logins within {timeout:.0f} s; log: {self.log_path}")

    def _signal(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl`` on this node (e.g. ``set_vm_memory_high_watermark 0.00001``: a memory alarm, which blocks
        every publishing connection until it is raised again); its output."""
        run = subprocess.run(
            [str(RABBITMQCTL), "-n", self.node, *args], env=self._env(), capture_output=True, text=True, timeout=60
        )
        if run.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {run.stderr or run.stdout}")
        return run.stdout

    def kill(self) -> None:
        """SIGKILL the node (a crash): what it had confirmed is on disk, the rest is lost."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)
