"""The prepared GPU session (``bench/gpu.sh all`` or ``python -m bench.gpu_all``): every per-GPU speed figure of
docs/benchmarks.md's *Prepared GPU session* in one command that fits one device lease, side by side on one GPU.

Phases (``PHASES``, in this order, each with its share of ``--budget-s``; a point that would start past its
phase's share is skipped and listed, so the command ends in time whatever this GPU's speed):

1. ``sd15``: ``bench.accel`` on SD 1.5's architecture at 512 px, 20 steps, stock and exact at batch 1/4/8/16:
   ``P6_exact_speedup_sd15_b8`` and the images/s table;
2. ``sd15-approx``: stock, approx, cached and quantized at batch 8 (the compiled graphs of batch 8 only):
   ``P6_approx_speedup_sd15_b8``, ``P6_approx_deviation_sd15_b8``;
3. ``dit``: SD3 Medium's architecture at 1024 px, stock and exact at batch 1/4: ``P6_exact_speedup_dit_b4``;
4. ``fleet``: ``bench.gpu`` with the compiled denoiser (pipeline alone at 1/8, fleets at max_num_seqs 1/8, a
   short Poisson run): ``P1_gpu_exact``, ``P2_gpu_exact``.

It writes ``<out>/accel-<phase>.json`` for the first three, ``gpu-exact.json`` and ``.md``, ``summary.json`` (the
figures, images/s by phase, variant and batch, each phase's time, what was skipped and each failed phase's error;
rewritten after every phase) and ``summary.md``: seven files, nothing else under ``<out>`` (the fleets' logs go to
``--log-dir``). A phase that fails is reported and the next one runs; the command then exits 1. ``--record DIR``
(where no GPU is needed) merges the non-null figures of such a directory into docs/benchmarks.json and copies its
JSON files into ``docs/bench/`` as ``<prefix>-<name>``; it refuses a directory a ``--tiny`` or CPU run wrote.
``--device cpu --tiny --no-compile`` runs the same phases at a tiny size (tests/integration/test_bench_gpu_all.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.accel import AccelConfig, run_accel
from bench.accel import markdown as accel_markdown
from bench.gpu import GpuRunConfig, NoCudaError, check_device, run_gpu
from bench.report import merge_figures, write_json

PHASES: dict[str, float] = {"sd15": 0.36, "sd15-approx": 0.2, "dit": 0.22, "fleet": 0.22}
"""Each phase's share of the budget (an unused share passes to the phases after it)."""

DEFAULT_BUDGET_S = 500.0
SUMMARY = "summary.json"


def phase_configs(
    device: str, tiny: bool, compile: bool, cache_dir: Path, out: Path, log_dir: Path
) -> dict[str, AccelConfig | GpuRunConfig]:
    """Each phase's configuration (``budget_s`` set by ``run_all``); ``tiny``: the tiny demos at 32/64 px, 2 steps,
    no timed window beyond two calls."""
    sd15 = AccelConfig(
        device=device,
        tiny=tiny,
        size=32 if tiny else 512,
        dit_size=32 if tiny else 1024,
        steps=2 if tiny else 20,
        batches=(8, 1, 4, 16),  # in this order: a budget that runs out keeps the figure's batch
        seconds=0.0 if tiny else 1.5,
        compile=compile,
        cache_dir=cache_dir,
        models=("sd15",),
        variants=("stock", "exact"),
        out=out / "accel-sd15.json",
    )
    return {
        "sd15": sd15,
        "sd15-approx": replace(
            sd15, batches=(8,), variants=("stock", "approx", "cached", "quantized"), out=out / "accel-sd15-approx.json"
        ),
        "dit": replace(sd15, batches=(4, 1), models=("dit",), out=out / "accel-dit.json"),
        "fleet": GpuRunConfig(
            device=device,
            tiny=tiny,
            size=64 if tiny else 512,
            steps=2 if tiny else 20,
            batches=(1, 8),
            seqs=(1, 2) if tiny else (1, 8),
            seconds=0.5 if tiny else 3.0,
            fleet_seconds=1.5 if tiny else 8.0,
            poisson_seconds=1.5 if tiny else 8.0,
            compile_denoiser=compile,
            cache_dir=cache_dir,
            out=out / "gpu-exact.json",
            markdown=out / "gpu-exact.md",
            log_dir=log_dir,
        ),
    }


def _images_per_s(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Images/s by variant and batch of one accel run (of one model)."""
    return {
        variant: {batch: round(p["images_per_s"], 4) for batch, p in run.get("batches", {}).items()}
        for points in results["models"].values()
        for variant, run in points.items()
    }


def run_all(
    device: str,
    tiny: bool,
    compile: bool,
    cache_dir: Path,
    out: Path,
    log_dir: Path,
    budget_s: float = DEFAULT_BUDGET_S,
    phases: tuple[str, ...] = tuple(PHASES),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every phase of ``phases`` in order; writes ``out``'s files; returns the summary."""
    check_device(device)
    out.mkdir(parents=True, exist_ok=True)
    configs = phase_configs(device, tiny, compile, cache_dir, out, log_dir)
    started = time.monotonic()
    summary: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": device,
        "tiny": tiny,
        "compile": compile,
        "figures": {},
        "images_per_s": {},
        "phase_s": {},
        "skipped": [],
        "errors": {},
    }
    tables: list[str] = []
    for position, phase in enumerate(PHASES):
        if phase not in phases:
            continue
        left = budget_s - (time.monotonic() - started)
        share = left * PHASES[phase] / sum(PHASES[p] for p in list(PHASES)[position:] if p in phases)
        begun = time.monotonic()
        log(f"== {phase}: {share:.0f} s of the {left:.0f} s left")
        cfg = configs[phase]
        try:
            if isinstance(cfg, AccelConfig):
                results = run_accel(replace(cfg, budget_s=share), log=log)
                summary["figures"] |= {k: v for k, v in results["figures"].items() if k not in summary["figures"] or v}
                summary["images_per_s"][phase] = _images_per_s(results)
                tables.append(accel_markdown(results))
            else:
                results = run_gpu(replace(cfg, budget_s=share), log=log)
                summary["figures"] |= {
                    "P1_gpu_exact": results["figures"]["P1"],
                    "P2_gpu_exact": results["figures"]["P2"],
                }
                summary["images_per_s"][phase] = {
                    batch: round(p["images_per_s"], 4) for batch, p in results["pipeline"]["batches"].items()
                }
                tables.append(cfg.markdown.read_text())
            summary["skipped"] += results["skipped"]
        except Exception as exc:  # noqa: BLE001 - a phase that fails is reported; the phases after it still run
            summary["errors"][phase] = f"{type(exc).__name__}: {exc}"
            log(f"{phase} failed: {traceback.format_exc()}")
        summary["phase_s"][phase] = round(time.monotonic() - begun, 1)
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        _write_summary(out, summary, tables)  # after each phase: a run stopped from outside keeps what it measured
    return summary


def _write_summary(out: Path, summary: dict[str, Any], tables: list[str]) -> None:
    write_json(out / SUMMARY, summary)
    figures = "\n".join(f"- `{k}`: {'-' if v is None else f'{v:.4g}'}" for k, v in summary["figures"].items())
    errors = "".join(f"\n- {phase} failed: {error}" for phase, error in summary["errors"].items())
    (out / "summary.md").write_text(
        f"# Per-GPU speed, {summary['started']}\n\n{figures}{errors}\n\n" + "\n\n".join(tables)
    )


def record(results_dir: Path, docs_dir: Path, prefix: str) -> dict[str, float]:
    """Merge the non-null figures of ``results_dir`` (a ``run_all`` output) into ``docs_dir/benchmarks.json`` and
    copy its JSON files into ``docs_dir/bench/<prefix>-<name>.json``; the figures merged. ValueError for a
    ``--tiny`` or CPU run's directory: its figures are no GPU's."""
    summary = json.loads((results_dir / SUMMARY).read_text())
    if summary["tiny"] or not str(summary["device"]).startswith("cuda"):
        raise ValueError(f"{results_dir} holds a --tiny or CPU run's figures: not recorded")
    figures = {k: v for k, v in summary["figures"].items() if v is not None}
    merge_figures(docs_dir / "benchmarks.json", figures)
    (docs_dir / "bench").mkdir(parents=True, exist_ok=True)
    for path in sorted(results_dir.glob("*.json")):
        shutil.copyfile(path, docs_dir / "bench" / f"{prefix}-{path.name}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument("--device", default="cuda", help="cuda (default; exits 2 without one), cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny demo models at 32/64 px (a CPU check)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="leave compilation out (CPU)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="all phases together")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"a subset of {','.join(PHASES)}")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the models are built once")
    parser.add_argument("--out", type=Path, default=Path("bench-results/gpu-all"), help="the seven result files")
    parser.add_argument("--log-dir", type=Path, default=Path("bench-results/logs/gpu-all"), help="the fleets' logs")
    parser.add_argument("--record", type=Path, default=None, help="record this results folder in docs/ and exit")
    parser.add_argument("--prefix", default="accel-gpu", help="--record: the docs/bench/ file names' prefix")
    parser.add_argument("--docs-dir", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    if args.record is not None:
        try:
            recorded = record(args.record, args.docs_dir, args.prefix)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(recorded, indent=2))
        return 0
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases or any(p not in PHASES for p in phases):
        parser.error(f"--phases: a subset of {','.join(PHASES)}")
    from shared.settings import Settings

    try:
        summary = run_all(
            args.device,
            args.tiny,
            args.compile,
            args.cache_dir or Settings().model_cache_dir,
            args.out,
            args.log_dir,
            args.budget_s,
            phases,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (NoCudaError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((args.out / "summary.md").read_text())
    print(f"figures: {json.dumps(summary['figures'])}; {summary['elapsed_s']} s; results in {args.out}")
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
