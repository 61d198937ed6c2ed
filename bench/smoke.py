"""A few-second run of the whole harness (fleet, load patterns, summaries, plot) with the null runner."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, run_load
from bench.report import plot_runs, summarize, write_json
from bench.targets import FusefleetTarget

SMOKE_LOADS = {
    "closed": LoadSpec(pattern="closed", count=40, concurrency=8),
    "poisson": LoadSpec(pattern="poisson", workload="mixed", count=30, rate=60.0),
    "burst": LoadSpec(pattern="burst", count=32, burst_size=16, burst_gap_s=0.3),
}


def run_smoke(log_dir: Path, out: Path | None = None) -> dict[str, Any]:
    """Run each pattern once against a fresh null-runner fleet; returns the summaries (and writes a plot)."""
    summaries: dict[str, Any] = {}
    with bench_fleet(
        max_num_seqs=8, wait_ms=20, runner="bench.runners:NullRunner", torch_threads=1, log_dir=log_dir
    ) as base:
        target = FusefleetTarget(base)
        for name, spec in SMOKE_LOADS.items():
            summaries[name] = summarize(asyncio.run(run_load(target, spec, timeout_s=60)))
    if out is not None:
        write_json(out, summaries)
        plot_runs(out.with_suffix(".png"), "smoke (null runner)", {"fusefleet": [(60.0, summaries["poisson"])]})
    return summaries
