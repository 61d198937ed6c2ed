"""The documented benchmark session: every figure (P1..P5) measured side by side in one run on this machine.

- P1 fleet efficiency: fleet images/s / pipeline-alone images/s at batch size 4, saturating closed-loop load.
- P2 batching gain kept: (fleet at max_num_seqs 4 / at 1) / (pipeline batch 4 / batch 1).
- P3 overhead with the null runner: end-to-end requests/s, and p50 latency at idle with wait 0.
- P4 fusefleet vs the best of BentoML and LitServe at the same Poisson loads, homogeneous and mixed sizes.
- P5 scale-out with the SIMULATED runner: throughput(N workers) / (N x throughput(1)), N = 1, 2, 4, 8.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.fleet import bench_fleet, free_port
from bench.loadgen import LoadSpec, Workload, run_load
from bench.report import plot_runs, summarize, write_json
from bench.targets import FusefleetTarget, PeerTarget, Target

TORCH_THREADS = 2
BATCH = 4
WAIT_MS = 20.0
P4_RATES = (6.0, 10.0, 14.0)
P4_COUNT = 150
SIM_BASE_MS, SIM_PER_IMAGE_MS = 100.0, 25.0
SCALE_WORKERS = (1, 2, 4, 8)


def _load(target: Target, spec: LoadSpec) -> dict[str, Any]:
    return summarize(asyncio.run(run_load(target, spec)))


def _fleet_run(log_dir: Path, spec: LoadSpec, **fleet: Any) -> dict[str, Any]:
    with bench_fleet(log_dir=log_dir, **fleet) as base:
        _load(FusefleetTarget(base), LoadSpec(pattern="closed", count=8, concurrency=4))  # warm-up
        return _load(FusefleetTarget(base), spec)


def pipeline_figures(results: dict[str, Any]) -> None:
    from bench.pipeline import measure_pipeline
    from shared.settings import Settings

    results["pipeline"] = measure_pipeline(Settings(torch_threads=TORCH_THREADS), (1, 2, 4, 8), seconds=6.0)


def p1_p2(results: dict[str, Any], logs: Path) -> dict[str, float]:
    saturate = LoadSpec(pattern="closed", count=240, concurrency=16)
    runs = {
        seqs: _fleet_run(
            logs / f"p12-{seqs}",
            saturate,
            max_num_seqs=seqs,
            wait_ms=WAIT_MS if seqs > 1 else 0.0,
            torch_threads=TORCH_THREADS,
        )
        for seqs in (1, BATCH)
    }
    results["p1_p2"] = {str(k): v for k, v in runs.items()}
    pipe = results["pipeline"]
    fleet_gain = runs[BATCH]["images_per_s"] / runs[1]["images_per_s"]
    pipe_gain = pipe[str(BATCH)]["images_per_s"] / pipe["1"]["images_per_s"]
    return {"P1": runs[BATCH]["images_per_s"] / pipe[str(BATCH)]["images_per_s"], "P2": fleet_gain / pipe_gain}


def p3(results: dict[str, Any], logs: Path) -> dict[str, float]:
    null = "bench.runners:NullRunner"
    busy = _fleet_run(
        logs / "p3-load",
        LoadSpec(pattern="closed", count=6000, concurrency=64),
        max_num_seqs=64,
        wait_ms=2.0,
        runner=null,
        torch_threads=1,
    )
    idle = _fleet_run(
        logs / "p3-idle",
        LoadSpec(pattern="closed", count=300, concurrency=1),
        max_num_seqs=1,
        wait_ms=0.0,
        runner=null,
        torch_threads=1,
    )
    results["p3"] = {"load": busy, "idle": idle}
    return {"P3_rps": busy["throughput_rps"], "P3_p50_ms": idle["latency_s"]["p50"] * 1000.0}


def _peer_runs(name: str, workload: Workload, model_dir: Path, logs: Path) -> list[tuple[float, dict[str, Any]]]:
    from bench.peers.launch import launch_peer, stop_peer, wait_ready

    port = free_port()
    proc = launch_peer(name, model_dir, port, BATCH, WAIT_MS, TORCH_THREADS, logs / f"{name}-{workload}.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, timeout=180, proc=proc)
        return _rate_sweep(PeerTarget(base, name), workload)
    finally:
        stop_peer(proc)


def _fusefleet_runs(workload: Workload, logs: Path) -> list[tuple[float, dict[str, Any]]]:
    with bench_fleet(
        max_num_seqs=BATCH,
        wait_ms=WAIT_MS,
        torch_threads=TORCH_THREADS,
        log_dir=logs / "p4-fleet",
        extra_env={"FUSEFLEET_BATCH_ORDER": "grouped"},
    ) as base:
        return _rate_sweep(FusefleetTarget(base), workload)


def _rate_sweep(target: Target, workload: Workload) -> list[tuple[float, dict[str, Any]]]:
    """A warm-up, then one Poisson run per offered load of P4_RATES."""
    _load(target, LoadSpec(pattern="closed", count=16, concurrency=4, workload=workload))
    return [
        (rate, _load(target, LoadSpec(pattern="poisson", rate=rate, count=P4_COUNT, workload=workload)))
        for rate in P4_RATES
    ]


def p4(results: dict[str, Any], logs: Path, docs: Path, with_peers: bool) -> dict[str, float]:
    from gpu_worker.demo_model import ensure_demo_model
    from shared.settings import Settings

    model_dir = ensure_demo_model(Settings().model_cache_dir)
    figures: dict[str, float] = {}
    for workload in ("homog", "mixed"):
        runs = {"fusefleet": _fusefleet_runs(workload, logs)}
        if with_peers:
            for peer in ("bentoml", "litserve"):
                runs[peer] = _peer_runs(peer, workload, model_dir, logs)
        results[f"p4_{workload}"] = {name: [[rate, s] for rate, s in points] for name, points in runs.items()}
        plot_runs(docs / "bench" / f"p4_{workload}.png", f"P4 {workload}: fusefleet vs peers (CPU, 64 px)", runs)
        if not with_peers:
            continue
        heaviest = {name: points[-1][1] for name, points in runs.items()}
        peers = [heaviest["bentoml"], heaviest["litserve"]]
        best_tput = max(p["images_per_s"] for p in peers)
        best_p99 = min(p["latency_s"]["p99"] for p in peers)
        figures[f"P4_{workload}_tput"] = heaviest["fusefleet"]["images_per_s"] / best_tput
        figures[f"P4_{workload}_p99"] = heaviest["fusefleet"]["latency_s"]["p99"] / best_p99
    return figures


def p5(results: dict[str, Any], logs: Path, docs: Path) -> dict[str, float]:
    env = {"FUSEFLEET_SIM_BASE_MS": str(SIM_BASE_MS), "FUSEFLEET_SIM_PER_IMAGE_MS": str(SIM_PER_IMAGE_MS)}
    per_worker_img_s = BATCH / ((SIM_BASE_MS + SIM_PER_IMAGE_MS * BATCH) / 1000.0)
    runs: dict[int, dict[str, Any]] = {}
    for workers in SCALE_WORKERS:
        spec = LoadSpec(pattern="closed", concurrency=4 * BATCH * workers, count=int(per_worker_img_s * workers * 12))
        runs[workers] = _fleet_run(
            logs / f"p5-{workers}",
            spec,
            max_num_seqs=BATCH,
            wait_ms=WAIT_MS,
            workers=workers,
            runner="bench.runners:SimulatedGpuRunner",
            torch_threads=1,
            extra_env=env,
        )
    base = runs[1]["images_per_s"]
    efficiency = {w: runs[w]["images_per_s"] / (w * base) for w in SCALE_WORKERS}
    results["p5"] = {
        "runs": {str(w): r for w, r in runs.items()},
        "efficiency": {str(w): e for w, e in efficiency.items()},
        "cost_model_ms": {"a": SIM_BASE_MS, "b": SIM_PER_IMAGE_MS},
    }
    _plot_scale(docs / "bench" / "p5_scaleout.png", runs, base)
    return {"P5": min(efficiency[w] for w in SCALE_WORKERS if w > 1)}


def _plot_scale(path: Path, runs: dict[int, dict[str, Any]], base: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted(runs)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(workers, [runs[w]["images_per_s"] for w in workers], marker="o", label="measured")
    ax.plot(workers, [w * base for w in workers], ls="--", label="N x one worker")
    ax.set(xlabel="workers", ylabel="images/s", title="P5 scale-out (SIMULATED GPU runner)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_session(out_dir: Path, docs_dir: Path, *, with_peers: bool = True) -> dict[str, float]:
    """Measure P1..P5; writes raw results to ``out_dir`` and the figures to ``docs_dir/benchmarks.json``."""
    logs = out_dir / "logs"
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    figures: dict[str, float] = {}
    pipeline_figures(results)
    figures |= p1_p2(results, logs)
    figures |= p3(results, logs)
    figures |= p4(results, logs, docs_dir, with_peers)
    figures |= p5(results, logs, docs_dir)
    results["figures"] = figures
    write_json(out_dir / "session.json", results)
    write_json(docs_dir / "benchmarks.json", {k: round(v, 4) for k, v in figures.items()})
    return figures
