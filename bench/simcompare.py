"""The GPU-shaped side-by-side (``python -m bench simcompare``): every figure measured on the simulated GPU.

Every server runs the same forward, ``bench/peers/simulated_gpu.py`` (sleep a + b x images weighted by area, CPU
free; a tiny grey PNG per image): fusefleet's ``SimulatedGpuRunner`` in both batch orders, and BentoML and
LitServe (``BENCH_RUNNER=simulated``) in their own venvs. Same max batch, same 20 ms wait window where a server
has one (BentoML has none; its latency SLO is set past any run so it queues instead of shedding), same client.

- **P4sim**: an open-loop Poisson sweep at fractions of the pipeline-alone capacity (``CostModel.capacity``:
  full single-size batches), homogeneous (512 px) and mixed (512/768 px interleaved), every system receiving the
  same arrivals at the same time from one client process (the servers sleep; the 2 cores stay mostly idle, and
  each point records how busy they were). Figures: fusefleet ``grouped`` over the best peer (highest
  throughput, lowest p99) at the heaviest load (saturation) and at 80 %.
- **P5**: scale-out, closed loop with 4 x max batch clients per worker: throughput(N) / (N x throughput(1)).
- **P1sim**: the one-worker P5 run's steady state over the cost model's limit, max batch / t(max batch). Steady
  state: the images of its forwards after the first, over the time from the first forward's end to the last one's
  (the worker's trace, ``FUSEFLEET_SIM_TRACE``): what the accelerator produces once saturated, without the start
  (the first arrivals of a closed loop are dispatched before the rest arrive) and the last answers' delivery. The
  end-to-end figure (answers over the whole run) is recorded next to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, Workload, run_load
from bench.peers.simulated_gpu import GPU_SHAPED, TRACE_ENV, CostModel
from bench.report import merge_figures, plot_sweep, summarize, write_json
from bench.targets import FusefleetTarget, PeerTarget, Target
from fusefleet.valkey import free_port

RUNNER = "bench.runners:SimulatedGpuRunner"
ORDERS = {"fusefleet-grouped": "grouped", "fusefleet-strict": "strict"}
"""fusefleet's systems: name -> FUSEFLEET_BATCH_ORDER."""
HEADLINE = "fusefleet-grouped"
PEERS = ("bentoml", "litserve")
SIDES: dict[Workload, tuple[int, ...]] = {"homog": (512,), "mixed": (512, 768)}
LOADS = (0.2, 0.5, 0.8, 1.1, 1.5)
STEPS, GUIDANCE = 20, 7.5
BENTOML_MAX_LATENCY_MS = 3_600_000
"""BentoML's latency SLO: past any run, so that it queues like the others instead of answering 503."""


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep of simulated systems takes (simcompare's and ``bench.stepmode``'s): the cost model, the max batch
    and admission wait of every system, the load points, each point's Poisson arrivals window, where results go."""

    cost: CostModel = GPU_SHAPED
    batch: int = 8
    wait_ms: float = 20.0
    loads: tuple[float, ...] = LOADS
    seconds: float = 20.0
    out_dir: Path = Path("bench-results")


@dataclass(frozen=True)
class SimConfig(SweepConfig):
    """One simcompare run. The defaults are the documented run (about 11 minutes on the 2-core machine)."""

    peers: bool = True
    scale_workers: tuple[int, ...] = (1, 2, 4, 8)
    scale_forwards: int = 10  # full forwards per worker in each closed-loop scale-out run
    docs_dir: Path = Path("docs")
    workloads: tuple[Workload, ...] = ("homog", "mixed")

    def __post_init__(self) -> None:
        check_sweep(self.loads, seconds=self.seconds, batch=self.batch, scale_forwards=self.scale_forwards)
        if self.scale_workers[:1] != (1,):
            raise ValueError("scale_workers must start with 1 (the baseline of P5 and P1sim)")


def check_sweep(loads: Sequence[float], *, seconds: float, **counts: int) -> None:
    """A sweep's bounds (``ValueError`` naming what is off): positive loads, positive ``seconds`` and counts (each
    at least 1), e.g. ``batch``."""
    if not loads or min(loads) <= 0:
        raise ValueError("loads must be positive fractions of the capacity")
    if seconds <= 0 or min(counts.values(), default=1) < 1:
        *rest, last = ["seconds", *counts]
        raise ValueError(f"{', '.join(rest)} and {last} must be positive")


# --- pure: load points, figures, tables --------------------------------------------------------------------------


def load_spec(workload: Workload, rate: float, seconds: float) -> LoadSpec:
    """The Poisson run of one load point; the same for every system (same seed: same arrival times)."""
    return LoadSpec(
        pattern="poisson",
        workload=workload,
        count=max(1, round(rate * seconds)),
        rate=rate,
        steps=STEPS,
        guidance_scale=GUIDANCE,
        sides=SIDES[workload],
    )


def ratios(points: Mapping[str, Sequence[Mapping[str, Any]]], index: int, system: str = HEADLINE) -> dict[str, float]:
    """``system``'s throughput over the best peer's and p99 over the best peer's, at load point ``index``."""
    peers = [points[peer][index] for peer in PEERS if peer in points]
    best_tput = max(p["images_per_s"] for p in peers)
    best_p99 = min(p["latency_s"]["p99"] for p in peers)
    mine = points[system][index]
    return {"tput": mine["images_per_s"] / best_tput, "p99": mine["latency_s"]["p99"] / best_p99}


def figures_of(sweeps: Mapping[str, Any], loads: Sequence[float]) -> dict[str, float]:
    """P4sim_<workload>_tput/_p99 at the heaviest load, and _tput_80/_p99_80 at 80 % when that point ran."""
    out: dict[str, float] = {}
    heaviest = loads.index(max(loads))
    for workload, sweep in sweeps.items():
        points = sweep["points"]
        if not any(peer in points for peer in PEERS):
            continue
        for name, value in ratios(points, heaviest).items():
            out[f"P4sim_{workload}_{name}"] = value
        if 0.8 in loads:
            for name, value in ratios(points, loads.index(0.8)).items():
                out[f"P4sim_{workload}_{name}_80"] = value
    return out


def _cell(summary: Mapping[str, Any]) -> str:
    latency = summary["latency_s"]
    cell = f"{summary['images_per_s']:.2f} · {latency['p50']:.2f} s · {latency['p99']:.2f} s"
    failed = summary["requests"] - summary["succeeded"]
    return cell + (f" ({failed} failed)" if failed else "")


PER_POINT = (
    ("Images per forward (mean over requests)", "mean_batch_size", "{:.1f}"),
    ("Time between forwards (median, ms)", "forward_gap_ms_p50", "{:.0f}"),
    ("Accelerator busy", "accelerator_busy", "{:.0%}"),
)
"""The per-point lines under each table: label, summary key, format."""


def _fmt(value: float | None, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def markdown(results: Mapping[str, Any]) -> str:
    """The tables of a run: per workload, img/s · p50 · p99 per load point and system; ratios; P5 and P1sim."""
    cost = results["cost_model_ms"]
    lines = [
        f"Simulated GPU: t = {cost['a']} ms + {cost['b']} ms x images (each weighted by its area / "
        f"{cost['ref_side']}²), max batch {results['batch']}, {results['seconds']} s of Poisson arrivals per point.",
        "",
    ]
    for workload, sweep in results["p4sim"].items():
        systems = list(sweep["points"])
        lines += [
            f"**{workload}** ({' / '.join(f'{side} px' for side in SIDES[workload])}; capacity "
            f"{sweep['capacity']:.2f} img/s in single-size batches, {sweep['split_capacity']:.2f} img/s when every "
            f"batch is split by size: at most {sweep['capacity'] / sweep['split_capacity']:.3f}x from grouping)",
            "",
            "| load | offered req/s | " + " | ".join(f"{name} img/s · p50 · p99" for name in systems) + " | CPU busy |",
            "|---" * (len(systems) + 3) + "|",
        ]
        for index, (load, rate) in enumerate(zip(sweep["loads"], sweep["rates"], strict=True)):
            cells = " | ".join(_cell(sweep["points"][name][index]) for name in systems)
            lines.append(f"| {load:.0%} | {rate:.2f} | {cells} | {sweep['cpu_busy'][index]:.0%} |")
        lines.append("")
        for label, key, fmt in PER_POINT:
            values = [
                f"{name} {' / '.join(_fmt(point.get(key), fmt) for point in sweep['points'][name])}" for name in systems
            ]
            lines.append(f"{label}, by load point: {'; '.join(values)}.")
        lines.append("")
    if results["figures"]:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {name} | {value:.3f} |" for name, value in sorted(results["figures"].items())]
        lines.append("")
    p5 = results.get("p5")
    if p5:
        workers = list(p5["efficiency"])
        lines += [
            "| workers | " + " | ".join(workers) + " |",
            "|---" * (len(workers) + 1) + "|",
            "| images/s | " + " | ".join(f"{p5['runs'][w]['images_per_s']:.2f}" for w in workers) + " |",
            "| throughput / (N x one worker) | " + " | ".join(f"{p5['efficiency'][w]:.3f}" for w in workers) + " |",
            "",
            f"P1sim = one worker's steady state / cost-model limit = {p5['steady_images_per_s']:.3f} / "
            f"{p5['limit_images_per_s']:.3f} img/s = {results['figures']['P1sim']:.4f} (end to end, first request "
            f"to last answer: {p5['runs']['1']['images_per_s'] / p5['limit_images_per_s']:.4f})",
        ]
    return "\n".join(lines) + "\n"


def steady_images_per_s(forwards: Sequence[Mapping[str, float]]) -> float:
    """Images/s of a saturated worker from its trace (``start``, ``end``, ``images`` per forward): the images of
    every forward after the first, over the time from the first forward's end to the last one's."""
    ordered = sorted(forwards, key=lambda forward: forward["start"])
    if len(ordered) < 2:
        raise ValueError("a steady state needs at least two forwards")
    return sum(forward["images"] for forward in ordered[1:]) / (ordered[-1]["end"] - ordered[0]["end"])


_PEER_BATCH = re.compile(r"\] \w+ batch size=(\d+) groups=\[([\d, ]+)\]")


def peer_batches(log_text: str) -> dict[str, Any]:
    """A peer's batches from its log lines (``peer_common.run_batch``): per request, the size of the pipeline
    call it ran in (a batch of two sizes is two calls), as fusefleet reports each request's fused forward size;
    and the calls per batch."""
    groups = [[int(size) for size in match[2].split(",")] for match in _PEER_BATCH.finditer(log_text)]
    calls = Counter(size for batch in groups for size in batch)
    requests = sum(size * count for size, count in calls.items())
    return {
        "batch_size_histogram": {str(size): size * count for size, count in sorted(calls.items())},
        "mean_batch_size": sum(size * size * count for size, count in calls.items()) / requests if requests else None,
        "calls_per_batch": sum(len(batch) for batch in groups) / len(groups) if groups else None,
    }


def forward_stats(forwards: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """From a system's forwards trace over one run: how many forwards, the median time from one forward's end to
    the next one's start (at saturation: the time the accelerator waits on the server), and the fraction of the
    time from the first start to the last end spent in forwards (the accelerator's busy fraction)."""
    ordered = sorted(forwards, key=lambda forward: forward["start"])
    gaps = [nxt["start"] - cur["end"] for cur, nxt in zip(ordered, ordered[1:], strict=False)]
    span = ordered[-1]["end"] - ordered[0]["start"] if ordered else 0.0
    return {
        "forwards": len(ordered),
        "forward_gap_ms_p50": 1000.0 * statistics.median(gaps) if gaps else None,
        "accelerator_busy": sum(f["end"] - f["start"] for f in ordered) / span if span > 0 else None,
    }


def cpu_busy(before: Sequence[int], after: Sequence[int]) -> float:
    """Busy fraction of all cores between two ``/proc/stat`` 'cpu' samples (idle and iowait count as idle)."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta)
    return 1.0 - (delta[3] + delta[4]) / total if total else 0.0


def cpu_sample() -> list[int]:
    """The 'cpu' line of ``/proc/stat`` (zeros off Linux), for ``cpu_busy``."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except OSError:  # not Linux: no figure, nothing else is affected
        return [0] * 8


# --- I/O: the servers and the runs -------------------------------------------------------------------------------


@contextmanager
def _servers(cfg: SimConfig, logs: Path) -> Iterator[dict[str, Target]]:
    """Every system of the sweep, up (the peers boot while the fleets start); all stopped on exit."""
    from bench.peers.launch import launch_peer, stop_peer, wait_ready

    (logs / "traces").mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        booting: dict[str, tuple[Any, str]] = {}
        for name in PEERS if cfg.peers else ():
            port = free_port()
            proc = launch_peer(
                name,
                None,
                port,
                cfg.batch,
                cfg.wait_ms,
                1,
                logs / f"{name}.log",
                max_latency_ms=BENTOML_MAX_LATENCY_MS,
                extra_env={"BENCH_RUNNER": "simulated", **cfg.cost.env(), TRACE_ENV: str(trace_path(logs, name))},
            )
            stack.callback(stop_peer, proc)
            booting[name] = (proc, f"http://127.0.0.1:{port}")
        targets: dict[str, Target] = {
            name: FusefleetTarget(
                stack.enter_context(_fleet(cfg, logs / name, order, trace=trace_path(logs, name))),
                name,
                fetch_images=True,
            )
            for name, order in ORDERS.items()
        }
        for name, (proc, url) in booting.items():
            wait_ready(url, timeout=180, proc=proc)
            targets[name] = PeerTarget(url, name)
        yield targets


def trace_path(logs: Path, name: str) -> Path:
    """System ``name``'s forwards trace (``simulated_gpu.record_forward``)."""
    return (logs / "traces" / f"{name}.jsonl").resolve()


def _fleet(cfg: SimConfig, logs: Path, order: str, workers: int = 1, trace: Path | None = None) -> Any:
    trace_env = {TRACE_ENV: str(trace)} if trace else {}
    return bench_fleet(
        max_num_seqs=cfg.batch,
        wait_ms=cfg.wait_ms,
        workers=workers,
        runner=RUNNER,
        torch_threads=1,
        log_dir=logs,
        extra_env={**cfg.cost.env(), "FUSEFLEET_BATCH_ORDER": order, **trace_env},
    )


def traced(trace: Path) -> list[dict[str, float]]:
    """The lines of a forwards trace so far (none before the first forward)."""
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []


def _one_load(target: Target, spec: LoadSpec) -> dict[str, Any]:
    return summarize(asyncio.run(run_load(target, spec)))


def all_loads(targets: Mapping[str, Target], spec: LoadSpec) -> dict[str, dict[str, Any]]:
    """The same load against every target at once, from this one process."""

    async def together() -> list[Any]:
        return await asyncio.gather(*(run_load(target, spec) for target in targets.values()))

    return {name: summarize(records) for name, records in zip(targets, asyncio.run(together()), strict=True)}


def output_digests(targets: Mapping[str, Target], params: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of the image each system returns for the same request (they must all be equal)."""
    from bench.peers.launch import peer_payload, png_from_response

    digests: dict[str, str] = {}
    with httpx.Client(timeout=120) as http:
        for name, target in targets.items():
            if isinstance(target, FusefleetTarget):
                rid = http.post(f"{target.base_url}/v1/requests", json=dict(params)).json()["id"]
                view = http.get(f"{target.base_url}/v1/requests/{rid}", params={"wait_s": 60}).json()
                if view["status"] != "succeeded":
                    raise RuntimeError(f"{name}: the check request ended {view['status']}: {view.get('error')}")
                png = http.get(f"{target.base_url}/v1/requests/{rid}/images/0").content
            else:
                assert isinstance(target, PeerTarget)
                answer = http.post(target.url, json=peer_payload(name, params))
                answer.raise_for_status()
                png = png_from_response(name, answer)
            digests[name] = hashlib.sha256(png).hexdigest()
    if len(set(digests.values())) != 1:
        raise RuntimeError(f"the systems return different images for the same request: {digests}")
    return digests


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _log_since(path: Path, offset: int) -> str:
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _sweep(
    targets: Mapping[str, Target],
    workload: Workload,
    cfg: SimConfig,
    log: Callable[[str], None],
    logs: Path,
) -> dict[str, Any]:
    peer_logs = {peer: logs / f"{peer}.log" for peer in PEERS}
    capacity = cfg.cost.capacity(SIDES[workload], cfg.batch)
    split = cfg.cost.split_capacity(SIDES[workload], cfg.batch)
    rates = [load * capacity for load in cfg.loads]
    warm = LoadSpec(pattern="closed", count=2 * cfg.batch, concurrency=cfg.batch, steps=STEPS, sides=SIDES[workload])
    all_loads(targets, warm)

    def point(rate: float) -> dict[str, dict[str, Any]]:
        logged = {name: _log_size(path) for name, path in peer_logs.items()}
        seen = {name: len(traced(trace_path(logs, name))) for name in targets}
        summaries = all_loads(targets, load_spec(workload, rate, cfg.seconds))
        for name, summary in summaries.items():
            if name in peer_logs:
                summary |= peer_batches(_log_since(peer_logs[name], logged[name]))
            summary |= forward_stats(traced(trace_path(logs, name))[seen[name] :])
        return summaries

    points, busy = sweep_points(targets, workload, zip(cfg.loads, rates, strict=True), point, _cell, log)
    return {
        "capacity": capacity,
        "split_capacity": split,
        "loads": list(cfg.loads),
        "rates": rates,
        "cpu_busy": busy,
        "points": points,
    }


def sweep_points(
    targets: Mapping[str, Target],
    workload: str,
    load_rates: Iterable[tuple[float, float]],
    point: Callable[[float], dict[str, dict[str, Any]]],
    cell: Callable[[Mapping[str, Any]], str],
    log: Callable[[str], None],
) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Each (load, rate) point in turn: ``point(rate)`` runs it against every target and gives each one's summary.
    Returns the summaries by target, and how busy the CPU was over each point; logs a line per point (``cell``)."""
    points: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    busy: list[float] = []
    for load, rate in load_rates:
        started, before = time.monotonic(), cpu_sample()
        for name, summary in point(rate).items():
            points[name].append(summary)
        busy.append(cpu_busy(before, cpu_sample()))
        log(
            f"{workload} {load:.0%} ({rate:.2f} req/s): "
            + ", ".join(f"{name} {cell(points[name][-1])}" for name in targets)
            + f"; CPU {busy[-1]:.0%}; {time.monotonic() - started:.0f} s"
        )
    return points, busy


def _saturated(target: Target, cfg: SimConfig, workers: int) -> dict[str, Any]:
    """Closed loop, 4 x max batch clients per worker: ``scale_forwards`` full forwards per worker."""
    spec = LoadSpec(
        pattern="closed",
        count=cfg.scale_forwards * cfg.batch * workers,
        concurrency=4 * cfg.batch * workers,
        steps=STEPS,
        sides=SIDES["homog"],
    )
    return _one_load(target, spec)


def _scaleout(cfg: SimConfig, one_worker: dict[str, Any], logs: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """P5: ``one_worker`` (measured on the sweep's headline fleet), then a fresh fleet per worker count."""
    runs = {"1": one_worker}
    for workers in cfg.scale_workers[1:]:
        with _fleet(cfg, logs / f"p5-{workers}", "grouped", workers) as base:
            target = FusefleetTarget(base, fetch_images=True)
            warm = cfg.batch * workers
            _one_load(target, LoadSpec(pattern="closed", count=warm, concurrency=warm, sides=SIDES["homog"]))
            runs[str(workers)] = _saturated(target, cfg, workers)
        log(f"scale-out {workers} workers: {runs[str(workers)]['images_per_s']:.2f} img/s")
    one = one_worker["images_per_s"]
    return {
        "runs": runs,
        "efficiency": {w: run["images_per_s"] / (int(w) * one) for w, run in runs.items()},
        "limit_images_per_s": cfg.cost.capacity(SIDES["homog"], cfg.batch),
    }


def _plot_scale(path: Path, p5: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = [int(w) for w in p5["runs"]]
    measured = [p5["runs"][str(w)]["images_per_s"] for w in workers]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(workers, measured, marker="o", label="measured")
    ax.plot(workers, [w * measured[0] for w in workers], ls="--", label="N x one worker")
    ax.plot(workers, [w * p5["limit_images_per_s"] for w in workers], ls=":", label="N x cost-model limit")
    ax.set(xlabel="workers", ylabel="images/s", title="P5 scale-out (SIMULATED GPU)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_simcompare(cfg: SimConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole run; writes ``out_dir/simcompare.json`` and ``.md``, merges the figures into
    ``docs_dir/benchmarks.json`` and writes the plots into ``docs_dir/bench/``. Returns the results."""
    logs = cfg.out_dir / "logs" / "simcompare"
    started = time.monotonic()
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cost_model_ms": {"a": cfg.cost.base_ms, "b": cfg.cost.per_image_ms, "ref_side": cfg.cost.ref_side},
        "batch": cfg.batch,
        "wait_ms": cfg.wait_ms,
        "seconds": cfg.seconds,
        "p4sim": {},
    }
    with _servers(cfg, logs) as targets:
        log(f"servers up in {time.monotonic() - started:.0f} s: {', '.join(targets)}")
        results["output_sha256"] = output_digests(targets, load_spec("homog", 1.0, 1.0).params(0))
        for workload in cfg.workloads:
            sweep = _sweep(targets, workload, cfg, log, logs)
            results["p4sim"][workload] = sweep
            plot_sweep(
                cfg.docs_dir / "bench" / f"p4sim_{workload}.png",
                f"P4sim {workload}: SIMULATED GPU (a={cfg.cost.base_ms:g} ms, b={cfg.cost.per_image_ms:g} ms), "
                f"max batch {cfg.batch}",
                {name: list(zip(cfg.loads, points, strict=True)) for name, points in sweep["points"].items()},
                sweep["capacity"],
            )
        seen = len(traced(trace_path(logs, HEADLINE)))
        one_worker = _saturated(targets[HEADLINE], cfg, 1)
        steady = steady_images_per_s(traced(trace_path(logs, HEADLINE))[seen:])
        log(f"saturated, one worker: {one_worker['images_per_s']:.2f} img/s end to end, {steady:.2f} steady")
    p5 = _scaleout(cfg, one_worker, logs, log)
    p5["steady_images_per_s"] = steady
    results["p5"] = p5
    _plot_scale(cfg.docs_dir / "bench" / "p5_scaleout.png", p5)
    figures = figures_of(results["p4sim"], cfg.loads)
    figures["P1sim"] = steady / p5["limit_images_per_s"]
    if len(cfg.scale_workers) > 1:
        figures["P5"] = min(e for w, e in p5["efficiency"].items() if w != "1")
    results["figures"] = figures
    results["duration_s"] = time.monotonic() - started
    write_json(cfg.out_dir / "simcompare.json", results)
    (cfg.out_dir / "simcompare.md").write_text(markdown(results))
    merge_figures(cfg.docs_dir / "benchmarks.json", figures)
    return results
