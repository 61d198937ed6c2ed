"""A worker whose model takes longer to load than Celery's default pool-start limit (4 s) still recovers.

The limit (``worker_proc_alive_timeout``) applies to pool processes that replace a dead one (after an
out-of-memory kill or a hard time limit). Left at Celery's default, the replacement is killed while it loads,
and replaced again, forever: the worker never serves again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from celery.app.defaults import DEFAULTS

from tests.integration.conftest import running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.slow_start import LOAD_S


def pool_children(pid: int) -> list[int]:
    """The direct children of process ``pid`` (read from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children


def test_a_replaced_pool_process_may_take_long_to_load(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert LOAD_S > DEFAULTS["worker_proc_alive_timeout"]  # longer than Celery's default pool-start limit
    log_dir = tmp_path_factory.mktemp("slow-start-logs")
    env = {"FUSEFLEET_RUNNER": "tests.support.slow_start:SlowStartRunner"}
    with running_fleet(redis_server, model_cache, lora_dir, log_dir, **env) as fleet:
        worker = fleet.workers[0]
        assert worker.process is not None
        (child,) = pool_children(worker.process.pid)
        os.kill(child, signal.SIGKILL)  # as the kernel's OOM killer or a hard time limit would
        wait_for(lambda: pool_children(worker.process.pid) not in ([], [child]), 30, "a replacement pool process")
        states = fleet.wait_done([fleet.submit(prompt="after the pool process was replaced")], timeout=90)
        assert {s["status"] for s in states.values()} == {"succeeded"}
        assert "Timed out waiting for UP message" not in worker.log(), worker.log()[-3000:]
