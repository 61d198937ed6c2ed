"""One API key's latency while another floods the fleet, under the fair order and under fcfs (SIMULATED GPU runner:
``SimulatedGpuRunner``, each forward sleeps ``a + b * B``). Every figure it gives is *simulated*.

``python -m bench fairness [--workers 2] [--seqs 4] [--requests 40] [--load 0.3]``: three fleets, each with two API
keys (``flood`` and ``probe``). Run 1 (fair order): ``probe`` alone sends ``requests`` requests, Poisson at
``load`` x the fleet's capacity. Runs 2 and 3 (``scheduling_policy`` fair, then fcfs): ``flood`` first submits a
backlog that keeps every worker busy for the whole run (far above capacity), then ``probe`` sends the same load.
A request's latency is its server-side ``finished_at - created_at``. ``fair_p99_ratio`` = probe's p99 with the
flood (fair) / its p99 alone (the issue's goal: <= 1.5); ``fcfs_p99_ratio`` the same under fcfs, side by side.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import bench_fleet
from bench.report import percentile
from shared.api_keys import new_token, token_hash

CHUNK = 256  # requests per POST /v1/requests/batch
BASE_MS, PER_IMAGE_MS = 200.0, 40.0  # the simulated forward: a + b x B (short, so the three runs fit in minutes)


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


def _latency(view: dict[str, Any]) -> float:
    return _seconds(view["finished_at"]) - _seconds(view["created_at"])


def _run(
    policy: str,
    *,
    flood: bool,
    workers: int,
    seqs: int,
    requests: int,
    load: float,
    log_dir: Path,
    seed: int,
) -> dict[str, Any]:
    """One fleet under ``policy``: probe's latencies (ms), with or without the flood."""
    tokens = {"flood": new_token(), "probe": new_token()}
    forward_s = (BASE_MS + PER_IMAGE_MS * seqs) / 1000
    capacity = workers * seqs / forward_s  # requests/s with full batches
    body: dict[str, Any] = {"width": 64, "height": 64, "num_inference_steps": 4}
    with tempfile.TemporaryDirectory(prefix="fusefleet-fair-") as tmp:
        keys_file = Path(tmp) / "keys.toml"
        keys_file.write_text(
            "".join(f'[keys.{name}]\nsha256 = "{token_hash(token)}"\n\n' for name, token in tokens.items())
        )
        env = {
            "FUSEFLEET_SIM_BASE_MS": str(BASE_MS),
            "FUSEFLEET_SIM_PER_IMAGE_MS": str(PER_IMAGE_MS),
            "FUSEFLEET_API_KEYS_FILE": str(keys_file),
            "FUSEFLEET_SCHEDULING_POLICY": policy,
        }
        with bench_fleet(
            max_num_seqs=seqs,
            wait_ms=10.0,
            workers=workers,
            runner="bench.runners:SimulatedGpuRunner",
            log_dir=log_dir,
            extra_env=env,
        ) as base:
            probe = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {tokens['probe']}"})
            flooder = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {tokens['flood']}"})
            with probe, flooder:
                phase_s = requests / (load * capacity)
                backlog_left = "n/a"
                backlog: list[str] = []
                if flood:
                    size = int(2 * capacity * (phase_s + 10)) + 2 * workers * seqs
                    for start in range(0, size, CHUNK):
                        chunk = [{**body, "prompt": f"flood {start + i}"} for i in range(min(CHUNK, size - start))]
                        response = flooder.post("/v1/requests/batch", json={"requests": chunk})
                        response.raise_for_status()
                        backlog += response.json()["ids"]
                    time.sleep(2 * forward_s)  # every worker busy with the flood's batches
                pause = random.Random(seed)
                ids = []
                for i in range(requests):
                    time.sleep(pause.expovariate(load * capacity))
                    response = probe.post("/v1/requests", json={**body, "prompt": f"probe {i}"})
                    response.raise_for_status()
                    ids.append(response.json()["id"])
                views = [probe.get(f"/v1/requests/{rid}", params={"wait_s": 60}).json() for rid in ids]
                if backlog:
                    backlog_left = flooder.get(f"/v1/requests/{backlog[-1]}").json()["status"]
    failed = [v.get("status", v) for v in views if v.get("status") != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} probe requests did not succeed: {failed[:3]}")
    ms = [_latency(v) * 1000 for v in views]
    return {
        "p50_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99) or max(ms),
        "max_ms": max(ms),
        "flood_still_queued": backlog_left == "queued" if flood else None,
    }


def measure(*, workers: int, seqs: int, requests: int, load: float, log_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Probe alone (fair), with the flood under fair and under fcfs, and the p99 ratios (see the module docstring)."""
    args: dict[str, Any] = {"workers": workers, "seqs": seqs, "requests": requests, "load": load, "seed": seed}
    alone = _run("fair", flood=False, log_dir=log_dir / "alone", **args)
    fair = _run("fair", flood=True, log_dir=log_dir / "fair", **args)
    fcfs = _run("fcfs", flood=True, log_dir=log_dir / "fcfs", **args)
    return {
        "simulated": True,
        "forward_ms": f"{BASE_MS} + {PER_IMAGE_MS} x B",
        **args,
        "alone": alone,
        "flood_fair": fair,
        "flood_fcfs": fcfs,
        "fair_p99_ratio": fair["p99_ms"] / alone["p99_ms"],
        "fcfs_p99_ratio": fcfs["p99_ms"] / alone["p99_ms"],
    }
