"""Step mode against request-level batching (``python -m bench stepmode``), on the SIMULATED GPU: every figure it
gives is *simulated*.

Three fleets of one worker each run ``SimulatedGpuRunner`` (``bench/runners.py``) on one cost model, the
GPU-shaped fit of Stable Diffusion 1.5 at 512 px on an H200 (``simulated_gpu.GPU_SHAPED``, a = 531 ms, b = 103.5
ms per image, a forward of 20 steps) in its per-step form (``FUSEFLEET_SIM_REF_STEPS=20``): a request-level
forward of B images and S steps costs ``(a + b * B) * S / 20``, one step of a running set of R rows
``(a + b * R) / 20``. Max batch (``max_num_seqs``) 8, admission wait 20 ms:

- ``step``: ``FUSEFLEET_STEP_MODE=1`` (requests join the worker's running set at the next step, leave when done);
- ``strict``: request-level, ``FUSEFLEET_BATCH_ORDER=strict`` (the default);
- ``grouped``: request-level, ``FUSEFLEET_BATCH_ORDER=grouped``.

Two workloads, 512 px: ``homog`` (20 steps, guidance 7.5) and ``mixed`` (10 and 20 steps alternating, guidance
5.0 and 7.5 alternating in pairs: the four combinations in turn, so no two neighbours share a compatibility key).
Open-loop Poisson arrivals at fractions (``LOADS``) of one **capacity**, the request-level capacity of the
homogeneous workload in full batches, 8 / t(8) requests/s; the same rates, the same arrival times (seed 0) and
the same requests for every system, which all receive them at once from one client process (the servers sleep,
so the CPU stays mostly free; each point records how busy it was).

Figures (``docs/benchmarks.json``): ``step_p99_ratio_80`` = step p99 / strict p99, homogeneous, 80 % load;
``step_mixed_tput`` = step throughput / strict throughput, mixed, 110 %. The per-point figures go under
``stepmode``.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec
from bench.peers.simulated_gpu import GPU_SHAPED, REF_STEPS, TRACE_ENV, CostModel
from bench.report import merge_figures, plot_sweep, write_json
from bench.simcompare import SweepConfig, all_loads, check_sweep, forward_stats, sweep_points, trace_path, traced
from bench.targets import FusefleetTarget, Target

StepWorkload = Literal["homog", "mixed"]

RUNNER = "bench.runners:SimulatedGpuRunner"
STEP_COST = replace(GPU_SHAPED, ref_steps=REF_STEPS)
"""The GPU-shaped model in its per-step form: a and b are a 20-step forward's."""
SIDE = 512
SYSTEMS: dict[str, dict[str, str]] = {
    "step": {"FUSEFLEET_STEP_MODE": "1"},
    "strict": {"FUSEFLEET_BATCH_ORDER": "strict"},
    "grouped": {"FUSEFLEET_BATCH_ORDER": "grouped"},
}
"""System name -> what its fleet sets on top of the common environment."""
BASELINES = ("strict", "grouped")
WORKLOADS: dict[StepWorkload, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "homog": ((20,), (7.5,)),
    "mixed": ((10, 20), (5.0, 5.0, 7.5, 7.5)),
}
"""Workload -> (step counts, guidance scales), each cycled request by request."""
LOADS = (0.5, 0.8, 1.1)
SECONDS = 40.0
"""Default Poisson arrivals window per point: the whole run takes about 7-8 minutes (the mixed points last longest:
``strict`` runs one request per forward there, about 2 requests/s, and drains its queue after the arrivals end)."""
GOALS = {"step_p99_ratio_80": ("<=", 0.6), "step_mixed_tput": (">=", 1.3)}
SECTION = "## Step mode against request-level batching (SIMULATED GPU)"


@dataclass(frozen=True)
class StepBenchConfig(SweepConfig):
    """One run; the defaults are the documented one."""

    cost: CostModel = STEP_COST
    loads: tuple[float, ...] = LOADS
    seconds: float = SECONDS
    workloads: tuple[StepWorkload, ...] = ("homog", "mixed")

    def __post_init__(self) -> None:
        check_sweep(self.loads, seconds=self.seconds, batch=self.batch)
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown or not self.workloads:
            raise ValueError(f"workloads must be among {', '.join(WORKLOADS)}, got {', '.join(self.workloads)}")


# --- pure: rates, load specs, ratios, tables ---------------------------------------------------------------------


def capacity_rps(cost: CostModel, batch: int) -> float:
    """Requests/s of request-level batching on the homogeneous workload in full batches: batch / t(batch) at 20
    steps."""
    return batch / cost.forward_s([(SIDE, SIDE)] * batch, WORKLOADS["homog"][0][0])


def offered_rates(capacity: float, loads: Sequence[float]) -> list[float]:
    """The Poisson rate of each load point (the same for every workload and system)."""
    return [load * capacity for load in loads]


def load_spec(workload: StepWorkload, rate: float, seconds: float, seed: int = 0) -> LoadSpec:
    """The Poisson run of one point: ``rate`` requests/s for ``seconds``, the workload's steps and guidance."""
    steps, guidance = WORKLOADS[workload]
    return LoadSpec(
        pattern="poisson",
        count=max(1, round(rate * seconds)),
        rate=rate,
        seed=seed,
        sides=(SIDE,),
        steps=steps[0],
        guidance_scale=guidance[0],
        steps_choices=steps,
        guidance_choices=guidance,
    )


def ratios(points: Mapping[str, Sequence[Mapping[str, Any]]], index: int) -> dict[str, float | None]:
    """At load point ``index``: step's p50, p99 and throughput over each baseline's (``p99_vs_strict``...); None
    where a figure is missing or a divisor is zero (a point where nothing succeeded)."""
    step = points["step"][index]
    out: dict[str, float | None] = {}
    for baseline in BASELINES:
        if baseline not in points:
            continue
        other = points[baseline][index]
        out[f"p50_vs_{baseline}"] = _ratio(step["latency_s"]["p50"], other["latency_s"]["p50"])
        out[f"p99_vs_{baseline}"] = _ratio(step["latency_s"]["p99"], other["latency_s"]["p99"])
        out[f"tput_vs_{baseline}"] = _ratio(step["throughput_rps"], other["throughput_rps"])
    return out


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def figures_of(workloads: Mapping[str, Mapping[str, Any]], loads: Sequence[float]) -> dict[str, float]:
    """``step_p99_ratio_80`` (homogeneous, 80 %, p99 step / strict) and ``step_mixed_tput`` (mixed, 110 %,
    throughput step / strict), each when its point ran."""
    out: dict[str, float] = {}
    wanted = (
        ("step_p99_ratio_80", "homog", 0.8, "p99_vs_strict"),
        ("step_mixed_tput", "mixed", 1.1, "tput_vs_strict"),
    )
    for name, workload, load, key in wanted:
        if workload in workloads and load in loads:
            value = ratios(workloads[workload]["points"], list(loads).index(load)).get(key)
            if value is not None:
                out[name] = value
    return out


def verdict(name: str, value: float) -> str:
    """'met' or 'missed' against the issue's goal for figure ``name``."""
    op, goal = GOALS[name]
    return "met" if (value <= goal if op == "<=" else value >= goal) else "missed"


def _cell(summary: Mapping[str, Any]) -> str:
    latency = summary["latency_s"]
    if latency["p50"] is None:
        return f"{summary['throughput_rps']:.2f} · - · - ({summary['requests'] - summary['succeeded']} failed)"
    cell = f"{summary['throughput_rps']:.2f} · {latency['p50']:.2f} s · {latency['p99']:.2f} s"
    failed = summary["requests"] - summary["succeeded"]
    return cell + (f" ({failed} failed)" if failed else "")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(results: Mapping[str, Any]) -> str:
    """The run's tables: per workload, req/s · p50 · p99 per load point and system, then step's ratios to the
    request-level systems, then the two figures against their goals."""
    cost = results["cost_model_ms"]
    a, b, ref = cost["a"], cost["b"], cost["ref_steps"]
    intro = (
        f"SIMULATED GPU: a request-level forward of B images and S steps costs ({a} + {b} x B) ms x S / {ref}, one "
        f"step of a running set of R rows ({a} + {b} x R) / {ref} ms; {SIDE} px, max batch {results['batch']}, "
        f"admission wait {results['wait_ms']:g} ms, one worker per system; {results['seconds']:g} s of Poisson "
        f"arrivals per point at fractions of {results['capacity_rps']:.2f} req/s (request-level, homogeneous, full "
        "batches)."
    )
    lines = [_wrap(intro), ""]
    for workload, sweep in results["workloads"].items():
        systems = list(sweep["points"])
        steps, guidance = sweep["steps"], sweep["guidance"]
        lines += [
            f"**{workload}** (steps {' / '.join(map(str, steps))}, guidance {' / '.join(f'{g:g}' for g in guidance)}"
            ", cycled request by request); each cell req/s · p50 · p99:",
            "",
            "| load | offered req/s | " + " | ".join(systems) + " | CPU busy |",
            "|---" * (len(systems) + 3) + "|",
        ]
        for index, (load, rate) in enumerate(zip(results["loads"], results["rates"], strict=True)):
            cells = " | ".join(_cell(sweep["points"][name][index]) for name in systems)
            lines.append(f"| {load:.0%} | {rate:.2f} | {cells} | {sweep['cpu_busy'][index]:.0%} |")
        lines += [
            "",
            "| load | step p99 / strict | step p99 / grouped | step req/s / strict | step req/s / grouped |",
            "|---|---|---|---|---|",
        ]
        for load, point in zip(results["loads"], sweep["ratios"], strict=True):
            keys = ("p99_vs_strict", "p99_vs_grouped", "tput_vs_strict", "tput_vs_grouped")
            lines.append(f"| {load:.0%} | " + " | ".join(_fmt(point.get(key)) for key in keys) + " |")
        per_forward = [
            f"{name} {' / '.join(_fmt1(point.get('per_forward')) for point in sweep['points'][name])}"
            for name in systems
        ]
        lines += ["", f"Rows per forward (step: per step), by load point: {'; '.join(per_forward)}.", ""]
    if results["figures"]:
        lines += ["| figure | goal | measured | verdict |", "|---|---|---|---|"]
        for name, value in sorted(results["figures"].items()):
            op, goal = GOALS[name]
            lines.append(f"| `{name}` | {op} {goal} | **{value:.3f}** | {verdict(name, value)} |")
        lines.append("")
    return "\n".join(lines)


def _wrap(paragraph: str) -> str:
    return textwrap.fill(paragraph, width=116, break_long_words=False, break_on_hyphens=False)


def _fmt1(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def docs_section(results: Mapping[str, Any]) -> str:
    """The docs/benchmarks.md section of a run: what ran, how to rerun it, its tables."""
    plots = ", ".join(f"[{workload}](bench/stepmode_{workload}.png)" for workload in results["workloads"])
    intro = (
        f"`python -m bench stepmode --docs` (`bench/stepmode.py`), last run {results['started']} "
        f"({results['duration_s']:.0f} s). **Every number in this section is simulated**: each worker runs "
        "`SimulatedGpuRunner`, which sleeps what the GPU would take (CPU free) and returns placeholder images; the "
        "request-level fleets and the step-mode fleet pay the same cost per denoising step. Three fleets (step mode, "
        "request-level `strict`, request-level `grouped`), one worker each, receive the same Poisson arrivals at the "
        f"same time from one client. Raw results: `bench-results/stepmode.json`; plots: {plots}."
    )
    return "\n".join([SECTION, "", _wrap(intro), "", markdown(results).rstrip("\n"), ""])


def replace_section(document: str, section: str) -> str:
    """``document`` with its ``SECTION`` (from its heading to the next ``## `` heading) replaced by ``section``,
    or ``section`` appended when it has none."""
    lines = document.splitlines()
    if SECTION not in lines:
        head = document.rstrip("\n")
        return (head + "\n\n" if head else "") + section.rstrip("\n") + "\n"
    start = lines.index(SECTION)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = lines[end:]
    return "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), *([""] + tail if tail else [])]) + "\n"


def docs_figures(results: Mapping[str, Any]) -> dict[str, Any]:
    """What goes under ``stepmode`` in docs/benchmarks.json: per workload and system, (load, req/s, p50, p99)."""
    return {
        "simulated": True,
        "capacity_rps": round(results["capacity_rps"], 4),
        "loads": list(results["loads"]),
        "points": {
            workload: {
                name: [
                    {
                        "load": load,
                        "rps": round(point["throughput_rps"], 4),
                        "p50_s": _round(point["latency_s"]["p50"]),
                        "p99_s": _round(point["latency_s"]["p99"]),
                    }
                    for load, point in zip(results["loads"], points, strict=True)
                ]
                for name, points in sweep["points"].items()
            }
            for workload, sweep in results["workloads"].items()
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def trace_stats(lines: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """``simcompare.forward_stats`` of a system's trace lines over one point (forwards, or steps for step mode),
    and the mean rows per forward (images; ``rows`` of a step)."""
    stats = forward_stats(lines)
    rows = [line.get("rows", line.get("images", 0)) for line in lines]
    stats["per_forward"] = sum(rows) / len(rows) if rows else None
    return stats


# --- I/O: the fleets and the run --------------------------------------------------------------------------------


@contextmanager
def _fleets(cfg: StepBenchConfig, logs: Path) -> Iterator[dict[str, Target]]:
    (logs / "traces").mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        targets: dict[str, Target] = {}
        for name, env in SYSTEMS.items():
            base = stack.enter_context(
                bench_fleet(
                    max_num_seqs=cfg.batch,
                    wait_ms=cfg.wait_ms,
                    runner=RUNNER,
                    torch_threads=1,
                    log_dir=logs / name,
                    extra_env={**cfg.cost.env(), **env, TRACE_ENV: str(trace_path(logs, name))},
                )
            )
            targets[name] = FusefleetTarget(base, name, fetch_images=True)
        yield targets


def _sweep(
    targets: Mapping[str, Target],
    workload: StepWorkload,
    cfg: StepBenchConfig,
    rates: Sequence[float],
    logs: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:

    def point(rate: float) -> dict[str, dict[str, Any]]:
        seen = {name: len(traced(trace_path(logs, name))) for name in targets}
        summaries = all_loads(targets, load_spec(workload, rate, cfg.seconds))
        for name, summary in summaries.items():
            summary |= trace_stats(traced(trace_path(logs, name))[seen[name] :])
        return summaries

    points, busy = sweep_points(targets, workload, zip(cfg.loads, rates, strict=True), point, _cell, log)
    steps, guidance = WORKLOADS[workload]
    return {
        "steps": list(steps),
        "guidance": list(guidance),
        "cpu_busy": busy,
        "points": points,
        "ratios": [ratios(points, index) for index in range(len(cfg.loads))],
    }


def run_stepmode(
    cfg: StepBenchConfig, docs_dir: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole run; writes ``out_dir/stepmode.json`` and ``.md``. With ``docs_dir``, merges the figures and the
    per-point ones (``stepmode``) into ``docs_dir/benchmarks.json``, writes the section of
    ``docs_dir/benchmarks.md`` and the plots ``docs_dir/bench/stepmode_<workload>.png``. Returns the results."""
    logs = cfg.out_dir / "logs" / "stepmode"
    started = time.monotonic()
    capacity = capacity_rps(cfg.cost, cfg.batch)
    rates = offered_rates(capacity, cfg.loads)
    results: dict[str, Any] = {
        "simulated": True,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cost_model_ms": {
            "a": cfg.cost.base_ms,
            "b": cfg.cost.per_image_ms,
            "ref_side": cfg.cost.ref_side,
            "ref_steps": cfg.cost.ref_steps or REF_STEPS,
        },
        "batch": cfg.batch,
        "wait_ms": cfg.wait_ms,
        "workers": 1,
        "seconds": cfg.seconds,
        "capacity_rps": capacity,
        "loads": list(cfg.loads),
        "rates": rates,
        "workloads": {},
    }
    with _fleets(cfg, logs) as targets:
        log(f"fleets up in {time.monotonic() - started:.0f} s: {', '.join(targets)}")
        warm = LoadSpec(pattern="closed", count=2 * cfg.batch, concurrency=cfg.batch, steps=20, sides=(SIDE,))
        all_loads(targets, warm)
        for workload in cfg.workloads:
            results["workloads"][workload] = _sweep(targets, workload, cfg, rates, logs, log)
    results["figures"] = figures_of(results["workloads"], cfg.loads)
    results["duration_s"] = time.monotonic() - started
    write_json(cfg.out_dir / "stepmode.json", results)
    (cfg.out_dir / "stepmode.md").write_text(markdown(results))
    if docs_dir is not None:
        write_docs(results, docs_dir)
    return results


def write_docs(results: Mapping[str, Any], docs_dir: Path) -> None:
    """Figures and per-point figures into ``benchmarks.json`` (other keys kept), the section of
    ``benchmarks.md``, the plots."""
    merge_figures(docs_dir / "benchmarks.json", results["figures"])
    path = docs_dir / "benchmarks.json"
    write_json(path, {**json.loads(path.read_text()), "stepmode": docs_figures(results)})
    document = docs_dir / "benchmarks.md"
    document.write_text(replace_section(document.read_text() if document.exists() else "", docs_section(results)))
    for workload, sweep in results["workloads"].items():
        runs = {name: list(zip(results["loads"], points, strict=True)) for name, points in sweep["points"].items()}
        plot_sweep(
            docs_dir / "bench" / f"stepmode_{workload}.png",
            f"step mode vs request-level, {workload}: SIMULATED GPU, max batch {results['batch']}",
            runs,
            results["capacity_rps"],
        )
