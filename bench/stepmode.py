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

Workloads, 512 px: ``homog`` (20 steps, guidance 7.5), ``mixed`` (10 and 20 steps alternating, guidance 5.0 and
7.5 alternating in pairs: the four combinations in turn, so no two neighbours share a compatibility key) and
``t2i_i2i`` (4 and 28 steps alternating, text-to-image and image-to-image at strength 0.6 in pairs). ``--cost dit``
replaces the UNet fit by ``DIT_COST``, a Flux-size transformer's per-step cost (derived from its FLOPs and the
H200's datasheet, see its docstring). Open-loop Poisson arrivals at fractions (``LOADS``) of each workload's
**capacity**, request-level in full batches of one kind, batch / mean t(batch) over its requests (homogeneous:
8 / t(8)); the same rates, the same arrival times (seed 0) and the same requests for every system, which all
receive them at once from one client process (the servers sleep, so the CPU stays mostly free; each point
records how busy it was).

Figures (``docs/benchmarks.json``, ``FIGURES``): ``step_p99_ratio_80`` = step p99 / strict p99, homogeneous, 80 %
load; ``step_homog_tput_110`` = step throughput / strict throughput, homogeneous, 110 %; ``step_mixed_tput`` = step
throughput / strict throughput, ``t2i_i2i``, 110 %. The per-point figures go under ``stepmode``.
"""

from __future__ import annotations

import json
import math
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
from bench.report import merge_figures, plot_sweep, replace_section, write_json
from bench.simcompare import SweepConfig, all_loads, check_sweep, forward_stats, sweep_points, trace_path, traced
from bench.targets import FusefleetTarget, Target

StepWorkload = Literal["homog", "mixed", "t2i_i2i"]

RUNNER = "bench.runners:SimulatedGpuRunner"
STEP_COST = replace(GPU_SHAPED, ref_steps=REF_STEPS)
"""The GPU-shaped model in its per-step form: a and b are a 20-step forward's."""
DIT_COST = CostModel(base_ms=10.0, per_image_ms=68.0, ref_side=512, ref_steps=1)
"""A transformer family (Flux-size DiT, 12 B parameters) on an H200 at 512 px, per denoising step: ``a + b * rows``
ms. Derived, not measured (docs/step_mode.md#step-mode-as-the-default): b = 2 x 12e9 parameters x 1536 tokens (1024
image + 512 text) = 37 TFLOP per image and step, at 55 % of the H200's 989 dense BF16 TFLOP/s = 68 ms; a = the
weights read once per call (24 GB at 4.8 TB/s = 5 ms) plus ~5 ms of kernel launches, so the denoiser is compute
bound from one row on (b / a = 6.8, where SD 1.5's UNet has b / a = 0.19)."""
COSTS: dict[str, CostModel] = {"unet": STEP_COST, "dit": DIT_COST}
"""``--cost`` name -> model."""
SIDE = 512
SYSTEMS: dict[str, dict[str, str]] = {
    "step": {"FUSEFLEET_STEP_MODE": "1"},
    "strict": {"FUSEFLEET_BATCH_ORDER": "strict"},
    "grouped": {"FUSEFLEET_BATCH_ORDER": "grouped"},
}
"""System name -> what its fleet sets on top of the common environment."""
BASELINES = ("strict", "grouped")
WORKLOADS: dict[StepWorkload, tuple[tuple[int, ...], tuple[float, ...], tuple[float | None, ...]]] = {
    "homog": ((20,), (7.5,), (None,)),
    "mixed": ((10, 20), (5.0, 5.0, 7.5, 7.5), (None,)),
    "t2i_i2i": ((4, 28), (3.5,), (None, None, 0.6, 0.6)),
}
"""Workload -> (step counts, guidance scales, image-to-image strengths: None is text-to-image), each cycled request
by request. ``t2i_i2i``: a distilled 4-step and a full 28-step variant, text-to-image and image-to-image at strength
0.6 (2 and 16 denoising steps), the four in turn, so no two neighbours share a compatibility key."""
LOADS = (0.5, 0.8, 1.1)
SECONDS = 40.0
"""Default Poisson arrivals window per point (``--seconds 20 --loads 0.8,1.1`` keeps a run near 3 minutes)."""
GOALS = {"step_p99_ratio_80": ("<=", 0.75), "step_mixed_tput": (">=", 2.0), "step_homog_tput_110": (">=", 1.0)}
FIGURES = (
    ("step_p99_ratio_80", "homog", 0.8, "p99_vs_strict"),
    ("step_homog_tput_110", "homog", 1.1, "tput_vs_strict"),
    ("step_mixed_tput", "t2i_i2i", 1.1, "tput_vs_strict"),
)
"""Figure -> (workload, load, ratio) it is read from."""
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


def denoising_steps(steps: int, strength: float | None) -> int:
    """What a request of ``steps`` runs (``bench.runners.denoising_steps``: image-to-image starts later)."""
    return steps if strength is None else max(1, min(int(steps * strength), steps))


def cycle_steps(workload: StepWorkload) -> list[int]:
    """The denoising steps of one full cycle of the workload's requests."""
    steps, guidance, strengths = WORKLOADS[workload]
    length = math.lcm(len(steps), len(guidance), len(strengths))
    return [denoising_steps(steps[i % len(steps)], strengths[i % len(strengths)]) for i in range(length)]


def capacity_rps(cost: CostModel, batch: int, workload: StepWorkload = "homog") -> float:
    """Requests/s of request-level batching on ``workload`` in full batches of one kind: batch / the mean
    t(batch) of its requests (homogeneous: batch / t(batch) at 20 steps)."""
    forwards = [cost.forward_s([(SIDE, SIDE)] * batch, steps) for steps in cycle_steps(workload)]
    return batch / (sum(forwards) / len(forwards))


def offered_rates(capacity: float, loads: Sequence[float]) -> list[float]:
    """The Poisson rate of each load point (the same for every workload and system)."""
    return [load * capacity for load in loads]


def load_spec(workload: StepWorkload, rate: float, seconds: float, seed: int = 0) -> LoadSpec:
    """The Poisson run of one point: ``rate`` requests/s for ``seconds``, the workload's steps and guidance."""
    steps, guidance, strengths = WORKLOADS[workload]
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
        strength_choices=strengths if any(s is not None for s in strengths) else (),
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
    """The ``FIGURES`` whose point ran: ``step_p99_ratio_80`` (homogeneous, 80 %, p99 step / strict),
    ``step_homog_tput_110`` (homogeneous, 110 %, throughput step / strict) and ``step_mixed_tput`` (``t2i_i2i``,
    110 %, throughput step / strict)."""
    out: dict[str, float] = {}
    for name, workload, load, key in FIGURES:
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
        tasks = " / ".join("t2i" if s is None else f"i2i {s:g}" for s in sweep.get("strengths", [None]))
        capacity = sweep.get("capacity_rps", results["capacity_rps"])
        lines += [
            f"**{workload}** (steps {' / '.join(map(str, steps))}, guidance {' / '.join(f'{g:g}' for g in guidance)}"
            f", tasks {tasks}, cycled request by request; loads of {capacity:.2f} req/s, its request-level capacity"
            " in full batches); each cell req/s · p50 · p99:",
            "",
            "| load | offered req/s | " + " | ".join(systems) + " | CPU busy |",
            "|---" * (len(systems) + 3) + "|",
        ]
        rates = sweep.get("rates", results["rates"])
        for index, (load, rate) in enumerate(zip(results["loads"], rates, strict=True)):
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
    steps, guidance, strengths = WORKLOADS[workload]
    return {
        "rates": list(rates),
        "steps": list(steps),
        "guidance": list(guidance),
        "strengths": list(strengths),
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
            capacity_of = capacity_rps(cfg.cost, cfg.batch, workload)
            sweep = _sweep(targets, workload, cfg, offered_rates(capacity_of, cfg.loads), logs, log)
            results["workloads"][workload] = {"capacity_rps": capacity_of, **sweep}
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
            sweep.get("capacity_rps", results["capacity_rps"]),
        )
