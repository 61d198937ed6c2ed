"""`fusefleet up` (the README's run command): embedded Valkey, whole fleet, Ctrl-C, persistence across restarts;
`fusefleet status` in a second shell finds that Valkey."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import REPO_ROOT, wait_for
from tests.support.redis_server import free_port


def plain_env() -> dict[str, str]:
    """A new shell's environment: no FUSEFLEET_* variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FUSEFLEET_")}


def fusefleet_status(workdir: Path) -> subprocess.CompletedProcess[str]:
    """`fusefleet status` as a second shell in the same folder runs it."""
    argv = [sys.executable, "-m", "fusefleet", "status"]
    env = {**plain_env(), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)


def start_up(workdir: Path, port: int, model_cache: Path, log: Path) -> subprocess.Popen[bytes]:
    env = plain_env()
    env.update(PYTHONPATH=str(REPO_ROOT), FUSEFLEET_MODEL_CACHE_DIR=str(model_cache), FUSEFLEET_WORKERS="1")
    with open(log, "ab") as out:
        # a session of its own, so the test can deliver Ctrl-C to the whole group as a terminal would
        return subprocess.Popen(
            [sys.executable, "-m", "fusefleet", "up", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ctrl_c(proc: subprocess.Popen[bytes]) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(timeout=60)


def test_up_runs_the_fleet_stops_on_ctrl_c_and_keeps_requests(tmp_path: Path, model_cache: Path) -> None:
    port, log = free_port(), tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    proc = start_up(tmp_path, port, model_cache, log)
    try:
        wait_for(lambda: "fusefleet is up" in log.read_text(), 120, f"the banner (log: {log})")
        assert f"curl -s -X POST {base}/v1/requests" in log.read_text()
        rid = httpx.post(f"{base}/v1/requests", json={"prompt": "persist me"}).json()["id"]

        def finished() -> dict[str, Any] | None:
            state = dict(httpx.get(f"{base}/v1/requests/{rid}", params={"wait_s": 5}, timeout=10).json())
            return state if state["status"] == "succeeded" else None

        wait_for(finished, 120, "the request to succeed")
        pointer = tmp_path / ".fusefleet" / "redis.json"
        url = json.loads(pointer.read_text())["url"]
        assert f"embedded Valkey on {url}" in log.read_text()
        status = fusefleet_status(tmp_path)
        assert status.returncode == 0, status.stderr
        assert f"redis: {url} (fusefleet up, .fusefleet/redis.json)" in status.stdout
        assert "requests: 1 accepted;" in status.stdout and "1 succeeded" in status.stdout, status.stdout
        assert "workers (1):" in status.stdout and ": live, idle" in status.stdout, status.stdout
    finally:
        assert ctrl_c(proc) == 0
    assert (tmp_path / ".fusefleet" / "valkey").is_dir()
    assert not pointer.exists(), "the URL of a stopped Valkey is left behind"
    leftovers = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes left after Ctrl-C: {leftovers}"

    again = start_up(tmp_path, port, model_cache, log)
    try:
        wait_for(lambda: log.read_text().count("fusefleet is up") == 2, 120, "the second banner")
        assert httpx.get(f"{base}/v1/requests/{rid}").json()["status"] == "succeeded"  # kept by append-only file
    finally:
        ctrl_c(again)
