"""Running the real ``fusefleet`` services as child processes of a test, each with its own log file.

Each service runs in a session of its own (signals reach its whole process group) and, on Linux, gets SIGTERM if
the thread that started it dies, so a test run killed outright leaves no services behind. Start services from
the main thread (or one that outlives them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None  # loaded here, not in a forked child


def _die_with_parent() -> None:  # runs in the child between fork and exec: no imports, no dlopen
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Service:
    """One ``fusefleet <command>`` process (or any argv) with a log file under ``log_dir``."""

    def __init__(
        self, name: str, argv: list[str], env: Mapping[str, str], log_dir: Path, *, inherit_env: bool = True
    ) -> None:
        self.name = name
        self.argv = argv
        base = os.environ if inherit_env else {}
        self.env = {**base, **env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def fusefleet(cls, name: str, command: list[str], env: Mapping[str, str], log_dir: Path) -> Service:
        return cls(name, [sys.executable, "-m", "fusefleet", *command], env, log_dir)

    def start(self) -> Service:
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it if it does not end in ``timeout`` seconds."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process = None


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def api_up(base_url: str, timeout: float = 2.0) -> bool:
    """Whether the api at ``base_url`` answers ``GET /healthz`` with 200 now (False while it cannot be reached)."""
    try:
        return httpx.get(f"{base_url}/healthz", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False
