"""A fusefleet fleet for one benchmark run: fresh embedded Valkey, api, scheduler, N workers, logs to files."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from fusefleet.up import LocalFleet
from fusefleet.valkey import free_port


def live_workers(client: redis.Redis) -> int:
    """The workers announced on this private server: every ``...workers`` zset's members (this tree names it
    ``RedisKeys().workers``; a baseline's tree may name it otherwise, as before the keys' hash tags)."""
    return sum(int(client.zcard(key)) for key in client.scan_iter(match="*workers", _type="zset"))


@contextmanager
def bench_fleet(
    *,
    max_num_seqs: int,
    wait_ms: float,
    workers: int = 1,
    runner: str | None = None,
    torch_threads: int = 2,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float = 180.0,
    code_dir: Path | None = None,
) -> Iterator[str]:
    """Start a fleet on a fresh embedded Valkey; yields the API base URL once every worker is live. ``code_dir``:
    the fleet's processes run from that source tree (an earlier revision, for a side-by-side baseline), the
    benchmark's client and this harness from this one."""
    env = {
        "FUSEFLEET_MAX_NUM_SEQS": str(max_num_seqs),
        "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": str(wait_ms),
        "FUSEFLEET_TORCH_THREADS": str(torch_threads),
        "FUSEFLEET_MAX_QUEUE_LEN": "1000000",
        **(extra_env or {}),
    }
    if runner:
        env["FUSEFLEET_RUNNER"] = runner
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fusefleet-bench-") as state:
        fleet = LocalFleet(
            host="127.0.0.1",
            port=port,
            workers=workers,
            state_dir=Path(state),
            env_overrides=env,
            log_dir=log_dir,
            code_dir=code_dir,
        )
        try:
            fleet.start()
            if not fleet.wait_until_ready(ready_timeout_s):
                raise RuntimeError(f"fleet did not start; logs in {log_dir}")
            client = redis.Redis.from_url(fleet.env["FUSEFLEET_REDIS_URL"])
            deadline = time.monotonic() + ready_timeout_s
            while (live := live_workers(client)) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {live} of {workers} workers came up")
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}"
        finally:
            fleet.stop()
