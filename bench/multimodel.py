"""One multi-model fleet against the same GPUs split into one fleet per model (SIMULATED GPU, model loads included).
Every figure it gives is *simulated*.

``python -m bench multimodel [--docs]``: two systems on the same number of simulated GPUs (``workers``), the same
cost model and the same Poisson arrivals (one seeded sequence of (offset, model) per load point, sent to both):

- **multi**: one fleet, every worker serves every model (``FUSEFLEET_MODELS``: three models of distinct sources, so
  three footprints), at most ``resident`` of them loaded at once (``FUSEFLEET_MAX_RESIDENT_MODELS``), placed by the
  scheduler's cost model (``scheduler.placement``);
- **split**: the workers divided by hand into one fleet per model, in proportion to the mix's average share (at
  least one each; ``split_workers``), each fleet its own embedded Valkey and only its model; a request goes to its
  model's fleet. Its workers load their one model once, at start, and never again.

The simulated GPU (``bench.runners.SimulatedGpuRunner``) costs ``(a + b x B) x scale`` per forward of B 512 px
images (a, b: the SD 1.5 on H200 fit, ``GPU_SHAPED``) and ``load_s x scale`` per model load
(``FUSEFLEET_SIM_LOAD_MS``; every load goes through the worker's residency, at start and on demand after an
eviction); ``min_residency_s`` and the mix's phases are scaled by the same factor, so the run is a time-lapse of the
unscaled one (the fleet's own overheads, e.g. the 20 ms admission window, are not scaled: they weigh twice as much
as they would at scale 1).

Mixes of three models: **skewed** (70/20/10 % throughout) and **shifting** (three phases of ``phase_s``: the hot
model, at 70 %, changes each phase, 70/20/10 -> 10/70/20 -> 20/10/70). Each load point offers a fraction of the
fleet's capacity in full batches (``workers x seqs / forward(seqs)``); a point reports completed/s over its span
(first send to last answer), p50/p99 latency, and the loads and evictions the fleets' ``/metrics`` counted during
it. The headline: the highest completed/s each system keeps with p99 at most ``p99_bound_s`` and no failure
(``sustained``), multi over split: ``multimodel_tput_ratio`` (shifting) and ``multimodel_skewed_tput_ratio``.
The figures are as coarse as the load grid: a system's sustained throughput is that of its heaviest point inside
the bound, not its exact knee.
"""

from __future__ import annotations

import asyncio
import random
import re
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.fleet import bench_fleet
from bench.peers.simulated_gpu import GPU_SHAPED
from bench.report import merge_figures, replace_section, summarize, write_json
from bench.targets import FusefleetTarget, RequestRecord

MODELS = ("m0", "m1", "m2")
SOURCES = ("demo:stable-diffusion", "demo:pixart", "demo:stable-diffusion-3")
"""Distinct sources, so the three models are three footprints (models of one source share one loaded copy); the
simulated runner builds nothing from them."""
SIDE = 512
STEPS = 20
SECTION = "## Several models: one multi-model fleet against one fleet per model (SIMULATED GPU)"
SYSTEMS = ("multi", "split")


@dataclass(frozen=True)
class Mix:
    """Shares of ``MODELS`` by phase; the phases follow one another every ``phase_s`` (one phase: a steady mix)."""

    name: str
    phases: tuple[tuple[float, ...], ...]

    def shares_at(self, offset_s: float, phase_s: float) -> tuple[float, ...]:
        """The shares in force ``offset_s`` seconds into a window."""
        return self.phases[min(int(offset_s // phase_s), len(self.phases) - 1)]

    @property
    def average(self) -> tuple[float, ...]:
        """Each model's share over the whole window."""
        return tuple(sum(phase[i] for phase in self.phases) / len(self.phases) for i in range(len(MODELS)))


MIXES = {
    "skewed": Mix("skewed", ((0.7, 0.2, 0.1),)),
    "shifting": Mix("shifting", ((0.7, 0.2, 0.1), (0.1, 0.7, 0.2), (0.2, 0.1, 0.7))),
}


def split_workers(shares: Sequence[float], workers: int) -> list[int]:
    """Workers per model in proportion to ``shares``, at least one each, largest remainder first (ties: the first
    model): what an operator splitting a pool by hand does. ValueError with fewer workers than models."""
    if workers < len(shares):
        raise ValueError(f"workers: {workers} cannot split among {len(shares)} models (one each at least)")
    total = sum(shares)
    exact = [workers * share / total for share in shares]
    counts = [max(1, int(value)) for value in exact]
    while sum(counts) > workers:  # the minimum of one each took too many: take back from the largest surplus
        index = max((i for i in range(len(counts)) if counts[i] > 1), key=lambda i: (counts[i] - exact[i], -i))
        counts[index] -= 1
    while sum(counts) < workers:
        index = max(range(len(counts)), key=lambda i: (exact[i] - counts[i], -i))
        counts[index] += 1
    return counts


def arrivals(rate: float, window_s: float, mix: Mix, phase_s: float, seed: int) -> list[tuple[float, str]]:
    """Poisson arrivals at ``rate``/s over ``window_s``: (offset, model), each model drawn by the shares of the
    phase its offset falls in."""
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    offset = rng.expovariate(rate)
    while offset < window_s:
        out.append((offset, rng.choices(MODELS, weights=mix.shares_at(offset, phase_s))[0]))
        offset += rng.expovariate(rate)
    return out


def sustained(points: Sequence[Mapping[str, Any]], p99_bound_s: float) -> Mapping[str, Any] | None:
    """The point of highest completed/s among those with p99 at most the bound and no failure (None: no such)."""
    inside = [
        point
        for point in points
        if point["succeeded"] == point["requests"] and (point["latency_s"]["p99"] or 0.0) <= p99_bound_s
    ]
    return max(inside, key=lambda point: point["throughput_rps"]) if inside else None


@dataclass(frozen=True)
class MultiModelConfig:
    """One run (module docstring). Seconds are unscaled except ``phase_s``, ``skewed_s`` and ``p99_bound_s``
    (wall-clock seconds of this run)."""

    workers: int = 4
    seqs: int = 4
    resident: int = 2
    scale: float = 0.5
    load_s: float = 6.0  # an SDXL-class load from local NVMe onto an H200 (5-10 s), against a ~1 s forward
    min_residency_s: float = 10.0  # the fleet's default
    phase_s: float = 8.0
    skewed_s: float = 12.0
    loads: tuple[float, ...] = (0.3, 0.45, 0.65, 0.85)
    p99_bound_s: float = 5.0
    mixes: tuple[str, ...] = ("skewed", "shifting")
    wait_ms: float = 20.0
    seed: int = 0
    out_dir: Path = Path("bench-results")
    log_dir: Path = field(default=Path("bench-results/logs/multimodel"))

    def __post_init__(self) -> None:
        unknown = [mix for mix in self.mixes if mix not in MIXES]
        if unknown:
            raise ValueError(f"mixes: {', '.join(unknown)} unknown (known: {', '.join(MIXES)})")
        if not 1 <= self.resident <= len(MODELS):
            raise ValueError(f"resident must be 1..{len(MODELS)}, got {self.resident}")
        if self.workers < len(MODELS):
            raise ValueError(f"workers: at least {len(MODELS)} (one per model in the split system)")
        if self.scale <= 0 or not self.loads or any(load <= 0 for load in self.loads):
            raise ValueError("scale and every load must be > 0")

    @property
    def forward_s(self) -> float:
        """Seconds of a full batch of ``seqs`` images on the scaled simulated GPU."""
        return self.scale * (GPU_SHAPED.base_ms + GPU_SHAPED.per_image_ms * self.seqs) / 1000

    @property
    def capacity_rps(self) -> float:
        """Requests/s of every worker busy with full batches, no load."""
        return self.workers * self.seqs / self.forward_s

    def window_s(self, mix: str) -> float:
        return self.phase_s * len(MIXES[mix].phases) if len(MIXES[mix].phases) > 1 else self.skewed_s

    def env(self) -> dict[str, str]:
        """The simulated GPU's variables and the batching, residency settings of every fleet of the run."""
        return {
            "FUSEFLEET_SIM_BASE_MS": str(GPU_SHAPED.base_ms * self.scale),
            "FUSEFLEET_SIM_PER_IMAGE_MS": str(GPU_SHAPED.per_image_ms * self.scale),
            "FUSEFLEET_SIM_REF_SIDE": str(SIDE),
            "FUSEFLEET_SIM_LOAD_MS": str(self.load_s * self.scale * 1000),
            "FUSEFLEET_MIN_RESIDENCY_S": str(self.min_residency_s * self.scale),
        }


METRIC_NAMES = {
    "fusefleet_model_load_seconds_count": "loads",
    "fusefleet_model_load_seconds_sum": "load_seconds",
    "fusefleet_model_evictions_total": "evictions",
}
METRIC_LINE = re.compile(r'^(\w+)\{model="([^"]+)"\} (\S+)$')


def residency_counters(base_urls: Sequence[str]) -> dict[str, float]:
    """Loads, their seconds and evictions counted so far by the fleets at ``base_urls`` (``GET /metrics``), summed."""
    totals = dict.fromkeys(METRIC_NAMES.values(), 0.0)
    for base in base_urls:
        text = httpx.get(f"{base}/metrics", timeout=30).text
        for line in text.splitlines():
            match = METRIC_LINE.match(line)
            if match and match.group(1) in METRIC_NAMES:
                totals[METRIC_NAMES[match.group(1)]] += float(match.group(3))
    return totals


async def _send_all(routes: Mapping[str, str], plan: Sequence[tuple[float, str]], seed: int) -> list[RequestRecord]:
    targets = {model: FusefleetTarget(url) for model, url in routes.items()}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        start = time.monotonic()

        async def one(index: int, offset: float, model: str) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            params = {
                "prompt": f"multimodel {seed} {index}",
                "model": model,
                "width": SIDE,
                "height": SIDE,
                "num_inference_steps": STEPS,
                "seed": seed * 100_000 + index,
            }
            return await targets[model].send(session, params)

        return list(await asyncio.gather(*(one(i, offset, model) for i, (offset, model) in enumerate(plan))))


def _point(cfg: MultiModelConfig, routes: Mapping[str, str], mix: str, load: float, seed: int) -> dict[str, Any]:
    plan = arrivals(load * cfg.capacity_rps, cfg.window_s(mix), MIXES[mix], cfg.phase_s, seed)
    bases = sorted(set(routes.values()))
    before = residency_counters(bases)
    records = asyncio.run(_send_all(routes, plan, seed))
    after = residency_counters(bases)
    summary = summarize(records)
    del summary["first_errors"]
    by_model = {
        model: summarize([r for (_, m), r in zip(plan, records, strict=True) if m == model])["latency_s"]["p99"]
        for model in MODELS
    }
    return {
        "load": load,
        "offered_rps": load * cfg.capacity_rps,
        **summary,
        "p99_by_model_s": by_model,
        "loads": after["loads"] - before["loads"],
        "evictions": after["evictions"] - before["evictions"],
        "load_seconds": after["load_seconds"] - before["load_seconds"],
        "errors": [r.error for r in records if r.error][:3],
    }


def _warm_up(routes: Mapping[str, str]) -> None:
    """Two requests per model, one after the other: first connections, first batches."""
    asyncio.run(_send_all(routes, [(0.0, model) for model in MODELS for _ in range(2)], seed=999))


def _run_system(
    cfg: MultiModelConfig, system: str, mixes: Sequence[str], log: Callable[[str], None]
) -> dict[str, list[dict[str, Any]]]:
    """Start ``system``'s fleets once, run every load point of ``mixes`` on them; {mix: points}."""
    models = ",".join(f"{model}={source}" for model, source in zip(MODELS, SOURCES, strict=True))
    with ExitStack() as stack:
        if system == "multi":
            env = {**cfg.env(), "FUSEFLEET_MODELS": models, "FUSEFLEET_MAX_RESIDENT_MODELS": str(cfg.resident)}
            base = stack.enter_context(
                bench_fleet(
                    max_num_seqs=cfg.seqs,
                    wait_ms=cfg.wait_ms,
                    workers=cfg.workers,
                    runner="bench.runners:SimulatedGpuRunner",
                    log_dir=cfg.log_dir / "multi",
                    extra_env=env,
                )
            )
            routes = dict.fromkeys(MODELS, base)
        else:
            counts = split_workers(MIXES[mixes[0]].average, cfg.workers)
            routes = {}
            for model, source, count in zip(MODELS, SOURCES, counts, strict=True):
                env = {**cfg.env(), "FUSEFLEET_MODELS": f"{model}={source}"}
                routes[model] = stack.enter_context(
                    bench_fleet(
                        max_num_seqs=cfg.seqs,
                        wait_ms=cfg.wait_ms,
                        workers=count,
                        runner="bench.runners:SimulatedGpuRunner",
                        log_dir=cfg.log_dir / f"split-{model}",
                        extra_env=env,
                    )
                )
        _warm_up(routes)
        out: dict[str, list[dict[str, Any]]] = {}
        for mix in mixes:
            out[mix] = []
            for index, load in enumerate(cfg.loads):
                point = _point(cfg, routes, mix, load, cfg.seed + 10 * index + (0 if mix == "skewed" else 5))
                log(
                    f"{system} {mix} load {load:g}: {point['throughput_rps']:.2f} req/s of "
                    f"{point['offered_rps']:.2f}, p50 {point['latency_s']['p50']:.2f} s, "
                    f"p99 {point['latency_s']['p99']:.2f} s, loads {point['loads']:g}, evictions {point['evictions']:g}"
                )
                out[mix].append(point)
        return out


def run_multimodel(
    cfg: MultiModelConfig, docs_dir: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Both systems on every mix (module docstring); results into ``out_dir/multimodel.json`` (and the docs)."""
    started = time.monotonic()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    splits = {mix: split_workers(MIXES[mix].average, cfg.workers) for mix in cfg.mixes}
    groups: dict[tuple[int, ...], list[str]] = {}  # the split fleets are started once per distinct division
    for mix in cfg.mixes:
        groups.setdefault(tuple(splits[mix]), []).append(mix)
    points: dict[str, dict[str, list[dict[str, Any]]]] = {mix: {} for mix in cfg.mixes}
    for mix, sweep in _run_system(cfg, "multi", cfg.mixes, log).items():
        points[mix]["multi"] = sweep
    for mixes in groups.values():
        for mix, sweep in _run_system(cfg, "split", mixes, log).items():
            points[mix]["split"] = sweep
    results: dict[str, Any] = {
        "simulated": True,
        "when": when,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "forward_s": cfg.forward_s,
        "capacity_rps": cfg.capacity_rps,
        "splits": splits,
        "points": points,
        "figures": figures(points, cfg),
        "seconds": time.monotonic() - started,
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(cfg.out_dir / "multimodel.json", results)
    if docs_dir is not None:
        write_docs(results, docs_dir)
    return results


def figures(points: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], cfg: MultiModelConfig) -> dict[str, float]:
    """The docs/benchmarks.json figures: each mix's sustained throughput ratio (multi / split; none when the split
    keeps no point inside the bound) and the p99 and throughput at the heaviest load side by side."""
    keys = {"shifting": "multimodel_tput_ratio", "skewed": "multimodel_skewed_tput_ratio"}
    out: dict[str, float] = {"multimodel_p99_bound_s": cfg.p99_bound_s}
    for mix, systems in points.items():
        multi, split = (sustained(systems[name], cfg.p99_bound_s) for name in SYSTEMS)
        if multi is not None and split is not None:
            out[keys[mix]] = multi["throughput_rps"] / split["throughput_rps"]
        heaviest = {name: systems[name][-1] for name in SYSTEMS}
        out[f"multimodel_{mix}_tput_ratio_at_max_load"] = (
            heaviest["multi"]["throughput_rps"] / heaviest["split"]["throughput_rps"]
        )
        for name in SYSTEMS:
            out[f"multimodel_{mix}_p99_s_{name}_at_max_load"] = heaviest[name]["latency_s"]["p99"] or 0.0
    return out


def _cell(point: Mapping[str, Any]) -> str:
    latency = point["latency_s"]
    failed = point["requests"] - point["succeeded"]
    extra = f", {failed} failed" if failed else ""
    return (
        f"{point['throughput_rps']:.2f} · {latency['p50']:.2f} s · {latency['p99']:.2f} s"
        f" · {point['loads']:g}/{point['evictions']:g}{extra}"
    )


def markdown(results: Mapping[str, Any]) -> str:
    """The tables: per mix and load, each system's req/s · p50 · p99 · loads/evictions."""
    cfg = results["config"]
    lines: list[str] = []
    for mix, systems in results["points"].items():
        split = "/".join(map(str, results["splits"][mix]))
        shares = " -> ".join("/".join(f"{100 * share:.0f}" for share in phase) for phase in MIXES[mix].phases)
        phases = f", a phase every {cfg['phase_s']:g} s" if len(MIXES[mix].phases) > 1 else ""
        lines += [
            "",
            f"**{mix}** ({shares} % of m0/m1/m2{phases}; split: {split} workers); each cell req/s · p50 · p99 ·"
            " loads/evictions:",
            "",
            "| load | offered req/s | multi | split | multi req/s / split |",
            "|---|---|---|---|---|",
        ]
        for multi, other in zip(systems["multi"], systems["split"], strict=True):
            ratio = multi["throughput_rps"] / other["throughput_rps"] if other["throughput_rps"] else float("nan")
            lines.append(
                f"| {100 * multi['load']:.0f}% | {multi['offered_rps']:.2f} | {_cell(multi)} | {_cell(other)} |"
                f" {ratio:.2f} |"
            )
        kept = {name: sustained(systems[name], cfg["p99_bound_s"]) for name in SYSTEMS}
        lines += [
            "",
            f"Sustained with p99 <= {cfg['p99_bound_s']:g} s: "
            + ", ".join(
                f"{name} {point['throughput_rps']:.2f} req/s (load {100 * point['load']:.0f}%)"
                if point
                else f"{name} none"
                for name, point in kept.items()
            )
            + (
                f": **{kept['multi']['throughput_rps'] / kept['split']['throughput_rps']:.2f}x**."
                if kept["multi"] and kept["split"]
                else "."
            ),
        ]
    return "\n".join(lines).lstrip("\n") + "\n"


def docs_section(results: Mapping[str, Any]) -> str:
    cfg = results["config"]
    scale = cfg["scale"]
    return f"""{SECTION}

`python -m bench multimodel --docs` (`bench/multimodel.py`), last run {results["when"]} ({results["seconds"]:.0f} s).
**Every number in this section is simulated**: each worker runs `SimulatedGpuRunner` (`FUSEFLEET_SIM_LOAD_MS`: its
construction, a model load, sleeps too), CPU free. {cfg["workers"]} simulated GPUs either way: **multi** is one fleet
whose every worker serves the three models m0, m1, m2 (three sources, three footprints) with
`FUSEFLEET_MAX_RESIDENT_MODELS={cfg["resident"]}` (a worker cannot hold all three: a model that is not resident is
loaded on demand, evicting the least recently used); **split** is one fleet per model, each its own embedded Valkey,
the workers divided by the mix's average share (at least one each), a request sent to its model's fleet. Same
Poisson arrivals (one seeded plan of offset and model per point, sent to both). Raw results:
`bench-results/multimodel.json`.

SIMULATED GPU, time-lapsed by {scale:g} (the cost model and the residency times alike; the fleet's own overheads are
not scaled): a forward of B 512 px images costs ({GPU_SHAPED.base_ms:.1f} + {GPU_SHAPED.per_image_ms:.1f} x B) ms x
{scale:g} ({1000 * results["forward_s"]:.0f} ms for a full batch of {cfg["seqs"]}), a model load {cfg["load_s"]:g} s x
{scale:g} (an SDXL-class pipeline from local NVMe onto an H200 takes 5-10 s: {cfg["load_s"]:g} s against a ~1 s
forward), `FUSEFLEET_MIN_RESIDENCY_S` {cfg["min_residency_s"]:g} s x {scale:g}; max batch {cfg["seqs"]}, admission wait
{cfg["wait_ms"]:g} ms. Loads are fractions of {results["capacity_rps"]:.2f} req/s (every GPU busy with full batches,
no load); a point offers its Poisson arrivals for {cfg["skewed_s"]:g} s (skewed) or three phases of {cfg["phase_s"]:g}
s (shifting: {cfg["phase_s"] / scale:g} s unscaled) and reports completed/s over its span (first send to last answer,
so a backlog drains into it), p50/p99 latency from the client, and the loads and evictions the fleets' `/metrics`
counted during it.

{markdown(results)}
{_findings(results)}

What limits these figures: the throughput kept under the p99 bound is that of the heaviest **grid** point inside it
(loads {", ".join(f"{100 * load:.0f}%" for load in cfg["loads"])}), not each system's exact knee; throughput is
completed/s over a point's span, which includes the tail of its last answers (so it reads a little under the offered
load even when nothing queues); a phase of {cfg["phase_s"] / scale:g} s unscaled is a far faster shift than real
traffic's (minutes); the split is the best static division of the average mix; with every model resident everywhere
(`FUSEFLEET_MAX_RESIDENT_MODELS` = the models) the multi-model fleet would need no load at all; the 2-core VM runs the
load generator, every service process and Valkey, so the fleet's own overhead (unscaled) weighs more than beside a GPU.
"""


def _reflowed(section: str) -> str:
    """Each prose paragraph of ``section`` wrapped at 120 columns (headings and tables as they are)."""
    paragraphs = section.strip("\n").split("\n\n")
    return (
        "\n\n".join(
            part
            if part.startswith(("#", "|"))
            else textwrap.fill(" ".join(part.split()), 120, break_long_words=False, break_on_hyphens=False)
            for part in paragraphs
        )
        + "\n"
    )


def _findings(results: Mapping[str, Any]) -> str:
    """What the run shows about residency: the loads the multi-model fleet made during the windows, and why."""
    multi = [point for systems in results["points"].values() for point in systems["multi"]]
    loads = sum(point["loads"] for point in multi)
    seconds = sum(point["load_seconds"] for point in multi)
    if loads:
        return (
            f"During the windows the multi-model fleet loaded a model {loads:g} times ({seconds / loads:.2f} s each on"
            " average, the simulated load as the workers measured it) and evicted"
            f" {sum(point['evictions'] for point in multi):g}: each cell's loads/evictions say where."
        )
    return (
        "**During the windows the multi-model fleet loaded no model** (loads/evictions 0/0 everywhere): it served each"
        " mix with the residency that start-up and the warm-up requests left (each worker keeps the last"
        f" {results['config']['resident']} models of its list at start, then loaded the first where a batch of it"
        " found no resident worker), whatever the demand. The scheduler's cost model (`scheduler/placement.py`) takes"
        " a cold load only when no resident worker is free and the model's backlog (its batches in flight and those"
        " its queued requests make) would wait at its resident workers over twice a load's seconds: in these windows"
        " no backlog grew that long."
    )


def write_docs(results: Mapping[str, Any], docs_dir: Path) -> None:
    """The figures into ``benchmarks.json`` (other keys kept) and the section of ``benchmarks.md``."""
    merge_figures(docs_dir / "benchmarks.json", results["figures"])
    document = docs_dir / "benchmarks.md"
    section = _reflowed(docs_section(results))
    document.write_text(replace_section(document.read_text() if document.exists() else "", section))
