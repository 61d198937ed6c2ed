"""One API key's latency while another floods the fleet, under the fair order and under fcfs, request-level and in
step mode (SIMULATED GPU runner: ``SimulatedGpuRunner``). Every figure it gives is *simulated*.

``python -m bench fairness [--workers 2] [--seqs 4] [--requests 40] [--load 0.3] [--modes request_level,step]``:
three fleets per mode, each with two API keys (``flood`` and ``probe``). Run 1 (fair order): ``probe`` alone sends
``requests`` requests, Poisson at ``load`` x the fleet's capacity. Runs 2 and 3 (``scheduling_policy`` fair, then
fcfs): ``flood`` first submits a backlog that keeps every worker busy for the whole run (far above capacity), then
``probe`` sends the same load. Each mode's runs are in that mode (``FUSEFLEET_STEP_MODE``), the alone baseline
too. One cost per denoising step in both modes (``FUSEFLEET_SIM_REF_STEPS`` = the requests' steps): a
request-level forward of B images costs ``a + b * B``, a step of a running set of R rows ``(a + b * R) / steps``.

A request's latency is its server-side ``finished_at - created_at`` (``start_*``: until its ``started_at``, its
wait). ``fair_p99_ratio_<mode>`` = probe's p99 with the flood (fair) / its p99 alone (the issue's goal: <= 1.5);
``fcfs_p99_ratio_<mode>`` the same under fcfs, side by side; ``fair_floor_<mode>`` the cost model's floor beside
it: ``(wait + a + b x seqs) / alone p99``, the least a flooded probe's p99 can be, its own steps in the flood's full
batches (sets) after the p99 of its least wait, with no overhead at all, over the alone run's measured p99. The
wait: request-level, the rest of a running full forward (``0.99 x (a + b x seqs)``: the flood starts every worker
at once and its forwards all cost the same, so the workers run in phase and the first to free is as far as any);
step mode, whose fair order swaps a probe into a full set at its next step boundary, the rest of one step.
That the flood kept every worker busy is checked, not assumed: its last request is still queued when the probes have
ended, and the workers' trace (``FUSEFLEET_SIM_TRACE``) over the probes' window gives ``busy`` (the fraction of
workers x window spent in forwards or steps; a fair run below ``BUSY_MIN`` raises) and ``rows`` (images per forward,
or rows per step).
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx

from bench.fleet import bench_fleet
from bench.peers.simulated_gpu import TRACE_ENV
from bench.report import percentile
from shared.api_keys import new_token, token_hash

Mode = Literal["request_level", "step"]
MODES: tuple[Mode, ...] = ("request_level", "step")
ANSWER: Mode = "request_level"
"""The mode whose ratio is ``fair_p99_ratio``, the issue's figure: the default mode (step mode's is
``fair_p99_ratio_step``, docs/benchmarks.md#fair-sharing-between-api-keys-simulated-gpu)."""
CHUNK = 256  # requests per POST /v1/requests/batch
BASE_MS, PER_IMAGE_MS = 200.0, 40.0  # the simulated forward: a + b x B (short, so the six runs fit in minutes)
STEPS = 4  # each request's denoising steps (and FUSEFLEET_SIM_REF_STEPS: a step costs (a + b x R) / STEPS)
BUSY_MIN = 0.9  # the least ``busy`` a flooded run may show: below, the flood did not keep every worker busy


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


def _latency(view: dict[str, Any]) -> float:
    return _seconds(view["finished_at"]) - _seconds(view["created_at"])


def _occupancy(trace: Path, start: float, end: float, workers: int) -> dict[str, float]:
    """From the workers' trace: the fraction of ``workers`` x [start, end] spent in forwards or steps, and the mean
    images per forward (rows per step) of those that ran in that window."""
    lines = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    inside = [line for line in lines if line["end"] > start and line["start"] < end]
    busy = sum(min(line["end"], end) - max(line["start"], start) for line in inside)
    rows = [line.get("rows", line.get("images", 0)) for line in inside]
    return {"busy": busy / (workers * (end - start)), "rows": statistics.mean(rows) if rows else 0.0}


def _run(
    policy: str,
    *,
    mode: Mode,
    flood: bool,
    workers: int,
    seqs: int,
    requests: int,
    load: float,
    log_dir: Path,
    seed: int,
) -> dict[str, Any]:
    """One fleet under ``policy`` in ``mode``: probe's latencies (ms), with or without the flood."""
    tokens = {"flood": new_token(), "probe": new_token()}
    forward_s = (BASE_MS + PER_IMAGE_MS * seqs) / 1000
    capacity = workers * seqs / forward_s  # requests/s with full batches
    body: dict[str, Any] = {"width": 64, "height": 64, "num_inference_steps": STEPS}
    with tempfile.TemporaryDirectory(prefix="fusefleet-fair-") as tmp:
        keys_file = Path(tmp) / "keys.toml"
        keys_file.write_text(
            "".join(f'[keys.{name}]\nsha256 = "{token_hash(token)}"\n\n' for name, token in tokens.items())
        )
        trace = Path(tmp) / "trace.jsonl"
        env = {
            "FUSEFLEET_SIM_BASE_MS": str(BASE_MS),
            "FUSEFLEET_SIM_PER_IMAGE_MS": str(PER_IMAGE_MS),
            "FUSEFLEET_SIM_REF_STEPS": str(STEPS),
            "FUSEFLEET_API_KEYS_FILE": str(keys_file),
            "FUSEFLEET_SCHEDULING_POLICY": policy,
            "FUSEFLEET_STEP_MODE": "1" if mode == "step" else "0",
            TRACE_ENV: str(trace),
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
        window = (min(_seconds(v["created_at"]) for v in views), max(_seconds(v["finished_at"]) for v in views))
        occupancy = _occupancy(trace, *window, workers)
    ms = [_latency(v) * 1000 for v in views]
    waits = [(_seconds(v["started_at"]) - _seconds(v["created_at"])) * 1000 for v in views]
    run: dict[str, Any] = {
        "p50_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99) or max(ms),
        "max_ms": max(ms),
        "start_p50_ms": statistics.median(waits),
        "start_p99_ms": percentile(waits, 99) or max(waits),
        **occupancy,
    }
    if flood:
        run["flood_still_queued"] = backlog_left == "queued"
        if policy == "fair" and (not run["flood_still_queued"] or run["busy"] < BUSY_MIN):
            raise RuntimeError(f"the flood did not keep every worker busy ({policy}, {mode}): {run}")
    return run


def floor(mode: Mode, seqs: int, alone_p99_ms: float) -> float:
    """The cost model's floor of ``fair_p99_ratio_<mode>`` over an alone p99 of ``alone_p99_ms``: the p99 of the
    least wait plus a full forward (a set's steps) of ``seqs``, with no overhead (see the module docstring)."""
    full_ms = BASE_MS + PER_IMAGE_MS * seqs
    wait_ms = 0.99 * (full_ms if mode == "request_level" else full_ms / STEPS)
    return (wait_ms + full_ms) / alone_p99_ms


def measure(
    *,
    workers: int,
    seqs: int,
    requests: int,
    load: float,
    log_dir: Path,
    modes: tuple[Mode, ...] = MODES,
    seed: int = 0,
) -> dict[str, Any]:
    """Per mode: probe alone (fair), with the flood under fair and under fcfs, and the p99 ratios (see the module
    docstring)."""
    args: dict[str, Any] = {"workers": workers, "seqs": seqs, "requests": requests, "load": load, "seed": seed}
    results: dict[str, Any] = {
        "simulated": True,
        "forward_ms": f"{BASE_MS} + {PER_IMAGE_MS} x B (a step: / {STEPS})",
        **args,
    }
    for mode in modes:
        alone = _run("fair", mode=mode, flood=False, log_dir=log_dir / mode / "alone", **args)
        fair = _run("fair", mode=mode, flood=True, log_dir=log_dir / mode / "fair", **args)
        fcfs = _run("fcfs", mode=mode, flood=True, log_dir=log_dir / mode / "fcfs", **args)
        results[mode] = {"alone": alone, "flood_fair": fair, "flood_fcfs": fcfs}
        results[f"fair_p99_ratio_{mode}"] = fair["p99_ms"] / alone["p99_ms"]
        results[f"fcfs_p99_ratio_{mode}"] = fcfs["p99_ms"] / alone["p99_ms"]
        results[f"fair_floor_{mode}"] = floor(mode, seqs, alone["p99_ms"])
    return results
