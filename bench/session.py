"""The documented CPU benchmark session: P1..P4 measured side by side in one run on this machine, with the real
(tiny) model.

- P1 fleet efficiency: fleet images/s / pipeline-alone images/s at batch size 4, saturating closed-loop load.
- P2 batching gain kept: (fleet at max_num_seqs 4 / at 1) / (pipeline batch 4 / batch 1).
- P3 overhead with the null runner: end-to-end requests/s, and p50 latency at idle with wait 0.
- P4 fusefleet vs the best of BentoML and LitServe at the same Poisson loads, homogeneous and mixed sizes.

The simulated figures (P4sim, P1sim, P5 scale-out) are ``bench.simcompare``'s (``python -m bench simcompare``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, Workload, run_load
from bench.pipeline import PipelineBench
from bench.report import merge_figures, plot_runs, summarize, write_json
from bench.targets import FusefleetTarget, PeerTarget, Target
from fusefleet.valkey import free_port
from shared.settings import Settings

TORCH_THREADS = 2
BATCH = 4
WAIT_MS = 20.0
P4_RATES = (6.0, 10.0, 14.0)
P4_COUNT = 150
PEERS = ("bentoml", "litserve")
ROUNDS = 3


def _load(target: Target, spec: LoadSpec) -> dict[str, Any]:
    return summarize(asyncio.run(run_load(target, spec)))


def _fleet_run(log_dir: Path, spec: LoadSpec, **fleet: Any) -> dict[str, Any]:
    with bench_fleet(log_dir=log_dir, **fleet) as base:
        _load(FusefleetTarget(base), LoadSpec(pattern="closed", count=8, concurrency=4))  # warm-up
        return _load(FusefleetTarget(base), spec)


def pipeline_figures(results: dict[str, Any]) -> PipelineBench:
    bench = PipelineBench(Settings(torch_threads=TORCH_THREADS))
    results["pipeline"] = {str(b): {"images_per_s": bench.images_per_s(b, seconds=6.0)} for b in (1, 2, 4, 8)}
    return bench


def p1_p2(results: dict[str, Any], logs: Path, pipe: PipelineBench) -> dict[str, float]:
    """Fleet vs pipeline alone at the same batch size, alternated ROUNDS times with the fleet up (idle while the
    pipeline runs), so slow phases of a shared machine hit both sides; the median ratio of the rounds counts."""
    ratios: dict[int, list[float]] = {}
    rounds: dict[str, list[dict[str, float]]] = {}
    for seqs in (1, BATCH):
        saturate = LoadSpec(pattern="closed", count=25 * seqs + 75, concurrency=16)
        wait = WAIT_MS if seqs > 1 else 0.0
        with bench_fleet(
            max_num_seqs=seqs, wait_ms=wait, torch_threads=TORCH_THREADS, log_dir=logs / f"p12-{seqs}"
        ) as base:
            target = FusefleetTarget(base)
            _load(target, LoadSpec(pattern="closed", count=8, concurrency=4))  # warm-up
            for _ in range(ROUNDS):
                alone = pipe.images_per_s(seqs, seconds=6.0)
                fleet = _load(target, saturate)
                rounds.setdefault(str(seqs), []).append(
                    {
                        "pipeline_images_per_s": alone,
                        "fleet_images_per_s": fleet["images_per_s"],
                        "fleet_mean_batch_size": fleet["mean_batch_size"] or 0.0,
                    }
                )
                ratios.setdefault(seqs, []).append(fleet["images_per_s"] / alone)
    results["p1_p2"] = rounds
    p1 = statistics.median(ratios[BATCH])
    return {"P1": p1, "P2": p1 / statistics.median(ratios[1])}


def p3(results: dict[str, Any], logs: Path) -> dict[str, float]:
    """fusefleet's own cost (null runner): throughput with 64 clients in batches of 64, latency of one alone."""
    runs = {"load": (6000, 64, 2.0), "idle": (300, 1, 0.0)}  # requests, clients (and max_num_seqs), wait ms
    results["p3"] = {
        name: _fleet_run(
            logs / f"p3-{name}",
            LoadSpec(pattern="closed", count=count, concurrency=clients),
            max_num_seqs=clients,
            wait_ms=wait_ms,
            runner="bench.runners:NullRunner",
            torch_threads=1,
        )
        for name, (count, clients, wait_ms) in runs.items()
    }
    busy, idle = results["p3"]["load"], results["p3"]["idle"]
    return {"P3_rps": busy["throughput_rps"], "P3_p50_ms": idle["latency_s"]["p50"] * 1000.0}


@contextmanager
def _peer(name: str, model_dir: Path, logs: Path) -> Iterator[PeerTarget]:
    from bench.peers.launch import launch_peer, stop_peer, wait_ready

    port = free_port()
    proc = launch_peer(name, model_dir, port, BATCH, WAIT_MS, TORCH_THREADS, logs / f"{name}.log")
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=180, proc=proc)
        yield PeerTarget(f"http://127.0.0.1:{port}", name)
    finally:
        stop_peer(proc)


def p4(results: dict[str, Any], logs: Path, docs: Path, with_peers: bool) -> dict[str, float]:
    """All systems stay up (idle while another is measured); at each offered load they run back to back in a
    rotating order, so the machine's slow and fast phases are shared."""
    from demo_models import ensure_demo_model

    model_dir = ensure_demo_model(Settings().model_cache_dir)
    figures: dict[str, float] = {}
    with ExitStack() as stack:
        fleet = bench_fleet(
            max_num_seqs=BATCH,
            wait_ms=WAIT_MS,
            torch_threads=TORCH_THREADS,
            log_dir=logs / "p4-fleet",
            extra_env={"FUSEFLEET_BATCH_ORDER": "grouped"},
        )
        targets: dict[str, Target] = {"fusefleet": FusefleetTarget(stack.enter_context(fleet))}
        if with_peers:
            for peer in PEERS:
                targets[peer] = stack.enter_context(_peer(peer, model_dir, logs))
        for workload in ("homog", "mixed"):
            runs = _rate_sweeps(targets, workload)
            results[f"p4_{workload}"] = {name: [[rate, s] for rate, s in points] for name, points in runs.items()}
            plot_runs(docs / "bench" / f"p4_{workload}.png", f"P4 {workload}: fusefleet vs peers (CPU, 64 px)", runs)
            if with_peers:
                heaviest = {name: points[-1][1] for name, points in runs.items()}
                peers = [heaviest[peer] for peer in PEERS]
                best_tput = max(p["images_per_s"] for p in peers)
                best_p99 = min(p["latency_s"]["p99"] for p in peers)
                figures[f"P4_{workload}_tput"] = heaviest["fusefleet"]["images_per_s"] / best_tput
                figures[f"P4_{workload}_p99"] = heaviest["fusefleet"]["latency_s"]["p99"] / best_p99
    return figures


def _rate_sweeps(targets: dict[str, Target], workload: Workload) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """A warm-up per system, then one Poisson run per system and offered load, systems in rotating order."""
    for target in targets.values():
        _load(target, LoadSpec(pattern="closed", count=16, concurrency=4, workload=workload))
    runs: dict[str, list[tuple[float, dict[str, Any]]]] = {name: [] for name in targets}
    names = list(targets)
    for i, rate in enumerate(P4_RATES):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            spec = LoadSpec(pattern="poisson", rate=rate, count=P4_COUNT, workload=workload)
            runs[name].append((rate, _load(targets[name], spec)))
    return runs


def run_session(out_dir: Path, docs_dir: Path, *, with_peers: bool = True) -> dict[str, float]:
    """Measure P1..P4; writes raw results to ``out_dir`` and merges the figures into ``docs_dir/benchmarks.json``."""
    logs = out_dir / "logs"
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    figures: dict[str, float] = {}
    pipe = pipeline_figures(results)
    figures |= p1_p2(results, logs, pipe)
    figures |= p3(results, logs)
    figures |= p4(results, logs, docs_dir, with_peers)
    results["figures"] = figures
    write_json(out_dir / "session.json", results)
    merge_figures(docs_dir / "benchmarks.json", figures)
    return figures
