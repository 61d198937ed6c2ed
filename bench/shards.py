"""What a request costs Redis and the scheduler with the models split over 1, 2 and 4 shards
(``python -m bench shards``; docs/architecture.md#shards).

Every configuration is the same fleet but for ``model_shards``: four models (``m0``..``m3``, the SIMULATED GPU runner
of ``bench.redis_cost``: 100 + 10 x B ms a forward, every step reported), one worker per model
(``FUSEFLEET_WORKER_MODELS``), one api, one scheduler process leading every shard, a private Valkey; the models in
one shard, two shards of two, or four shards of one (``LAYOUTS``). The requests go closed-loop (``concurrency``
clients submitting and long-polling) to the four models in turn, so every configuration serves the same work.

Each run warms up, sends ``CONFIG RESETSTAT`` and runs its window (``bench.redis_cost``'s figures: commands per
request, Redis CPU per request); the scheduler's and the api's CPU over the window come from ``/proc/<pid>/stat``
(``utime + stime``, every thread). Then the fleet runs on without requests for ``idle_s``: Redis's and the scheduler's
CPU per second (each shard adds its own lease renewals, reaper and blocking reads), the part of each per-request
figure that is time, not requests. ``--docs`` writes ``shard_redis_us_per_request_<n>``,
``shard_redis_cmds_per_request_<n>``, ``shard_scheduler_us_per_request_<n>`` and the idle rates
(``shard_redis_idle_ms_per_s_<n>``, ``shard_scheduler_idle_ms_per_s_<n>``) into docs/benchmarks.json and the
"Shards" section of docs/benchmarks.md, with the load average of the machine beside them.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.loadgen import LoadSpec
from bench.redis_cost import (
    RUNNERS,
    SIM_ENV,
    WARM_UP,
    RedisCost,
    command_costs,
    run_to_success,
    server_cpu_s,
    server_reads,
)
from bench.report import merge_figures, replace_section
from bench.targets import FusefleetTarget
from fusefleet.up import LocalFleet
from fusefleet.valkey import EmbeddedValkey, free_port
from shared.keys import RedisKeys
from shared.settings import Settings
from shared.shards import Shards

MODELS = ("m0", "m1", "m2", "m3")
LAYOUTS: dict[int, dict[str, str]] = {
    1: dict.fromkeys(MODELS, "s0"),
    2: {"m0": "s0", "m1": "s0", "m2": "s1", "m3": "s1"},
    4: {model: f"s{i}" for i, model in enumerate(MODELS)},
}
"""The models' shards (``model_shards``) of each configuration, by its number of shards."""
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ModelsSpec(LoadSpec):
    """A ``LoadSpec`` whose requests go to ``models`` in turn."""

    models: tuple[str, ...] = MODELS

    def params(self, index: int) -> dict[str, Any]:
        return {**super().params(index), "model": self.models[index % len(self.models)]}


@dataclass(frozen=True)
class ShardRun:
    """One configuration's window: what Redis did (``redis``), the scheduler's and the api's CPU seconds in it, and
    the idle rates after it (CPU seconds per second with the fleet up and no requests)."""

    shards: int
    redis: RedisCost
    scheduler_cpu_s: float
    api_cpu_s: float
    scheduler_idle_rate: float
    load_average: float  # the machine's 1-minute load average at the window's end

    @property
    def requests_per_s(self) -> float:
        return self.redis.requests / self.redis.window_s if self.redis.window_s else 0.0

    @property
    def scheduler_us_per_request(self) -> float:
        return self.scheduler_cpu_s * 1e6 / self.redis.requests

    @property
    def api_us_per_request(self) -> float:
        return self.api_cpu_s * 1e6 / self.redis.requests

    @property
    def scheduler_idle_share_us(self) -> float:
        """The part of ``scheduler_us_per_request`` the scheduler would have spent idle over the window."""
        return self.scheduler_idle_rate * self.redis.window_s * 1e6 / self.redis.requests

    def summary(self) -> dict[str, float]:
        """The run's figures, one level (what the report prints and the test reads)."""
        return {
            "shards": self.shards,
            "requests": self.redis.requests,
            "window_s": self.redis.window_s,
            "requests_per_s": self.requests_per_s,
            "redis_us_per_request": self.redis.us_per_request,
            "redis_cmds_per_request": self.redis.cmds_per_request,
            "redis_reads_per_request": self.redis.reads_per_request,
            "redis_idle_ms_per_s": self.redis.idle_cpu_rate * 1e3,
            "redis_idle_share_us": self.redis.idle_share_us,
            "scheduler_us_per_request": self.scheduler_us_per_request,
            "scheduler_idle_ms_per_s": self.scheduler_idle_rate * 1e3,
            "scheduler_idle_share_us": self.scheduler_idle_share_us,
            "api_us_per_request": self.api_us_per_request,
            "load_average": self.load_average,
        }


def proc_cpu_s(stat: str) -> float:
    """The CPU seconds (``utime + stime``, every thread) of a process from its ``/proc/<pid>/stat`` line."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _process_cpu_s(pid: int) -> float:
    return proc_cpu_s(Path(f"/proc/{pid}/stat").read_text())


@contextmanager
def shard_fleet(
    layout: Mapping[str, str], *, seqs: int, log_dir: Path, ready_timeout_s: float = 180.0
) -> Iterator[tuple[LocalFleet, str, redis.Redis]]:
    """A fleet of ``MODELS`` split as ``layout`` says, one worker per model, on a private Valkey; yields the fleet,
    its API base URL and a client of its Valkey once every worker is live in its shard."""
    with tempfile.TemporaryDirectory(prefix="fusefleet-shards-") as folder:
        server = EmbeddedValkey(Path(folder) / "valkey").start()
        env = {
            "FUSEFLEET_REDIS_URL": server.url,
            "FUSEFLEET_RUNNER": RUNNERS["simulated"],
            **SIM_ENV,
            "FUSEFLEET_MODELS": ",".join(f"{model}=demo:stable-diffusion" for model in MODELS),
            "FUSEFLEET_MODEL_SHARDS": ",".join(f"{model}={shard}" for model, shard in layout.items()),
            "FUSEFLEET_MAX_NUM_SEQS": str(seqs),
            "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "20",
            "FUSEFLEET_TORCH_THREADS": "1",
            "FUSEFLEET_MAX_QUEUE_LEN": "1000000",
        }
        shards = Shards(Settings(models=env["FUSEFLEET_MODELS"], model_shards=dict(layout)))
        prefixes = [shards.settings_of(shard).key_prefix for shard in shards.names]
        port = free_port()
        fleet = LocalFleet(
            host="127.0.0.1", port=port, workers=0, state_dir=Path(folder), env_overrides=env, log_dir=log_dir
        )
        try:
            with redis.Redis.from_url(server.url) as client:
                fleet.start()
                for model in MODELS:
                    fleet._spawn(f"worker-{model}", ["worker"], {**fleet.env, "FUSEFLEET_WORKER_MODELS": model})
                if not fleet.wait_until_ready(ready_timeout_s):
                    raise RuntimeError(f"fleet did not start; logs in {log_dir}")
                deadline = time.monotonic() + ready_timeout_s
                while (live := sum(client.zcard(RedisKeys(prefix).workers) for prefix in prefixes)) < len(MODELS):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {live} of {len(MODELS)} workers came up; logs in {log_dir}")
                    time.sleep(0.2)
                yield fleet, f"http://127.0.0.1:{port}", client
        finally:
            fleet.stop()
            server.stop()


def measure(
    shards: int, *, requests: int, concurrency: int, steps: int, seqs: int, log_dir: Path, idle_s: float
) -> ShardRun:
    """One configuration (``LAYOUTS[shards]``): warm up, reset the stats, the window, then the idle rates."""
    with shard_fleet(LAYOUTS[shards], seqs=seqs, log_dir=log_dir / f"shards{shards}") as (fleet, base, client):
        target = FusefleetTarget(base, wait_s=60)
        run_to_success(target, ModelsSpec(pattern="closed", count=WARM_UP, concurrency=concurrency, steps=steps))
        scheduler, api = fleet.processes["scheduler"].pid, fleet.processes["api"].pid
        client.config_resetstat()
        reads_before, before = server_reads(client), server_cpu_s(client)
        scheduler_before, api_before, started = _process_cpu_s(scheduler), _process_cpu_s(api), time.monotonic()
        load = ModelsSpec(pattern="closed", count=requests, concurrency=concurrency, steps=steps, seed=WARM_UP)
        run_to_success(target, load)
        cpu_s, window_s = server_cpu_s(client) - before, time.monotonic() - started
        scheduler_cpu_s, api_cpu_s = _process_cpu_s(scheduler) - scheduler_before, _process_cpu_s(api) - api_before
        reads = server_reads(client) - reads_before - 3  # less the benchmark's own: two INFO cpu, this INFO stats
        commands = tuple(command_costs(client.info("commandstats")))
        load_average = os.getloadavg()[0]
        idle_rate = scheduler_idle_rate = 0.0
        if idle_s > 0:
            time.sleep(1.0)  # the window's last long polls end
            idle_before, scheduler_idle_before = server_cpu_s(client), _process_cpu_s(scheduler)
            idle_started = time.monotonic()
            time.sleep(idle_s)
            idle_window = time.monotonic() - idle_started
            idle_rate = (server_cpu_s(client) - idle_before) / idle_window
            scheduler_idle_rate = (_process_cpu_s(scheduler) - scheduler_idle_before) / idle_window
    cost = RedisCost(requests, commands, cpu_s, window_s, idle_rate, (), reads)
    return ShardRun(shards, cost, scheduler_cpu_s, api_cpu_s, scheduler_idle_rate, load_average)


def run(counts: Sequence[int] = (1, 2, 4), **kwargs: Any) -> list[ShardRun]:
    """``measure`` each number of shards in turn, in one run (side by side on this machine)."""
    return [measure(shards, **kwargs) for shards in counts]


ROWS = (
    ("requests/s (closed loop)", "requests_per_s", "{:.1f}"),
    ("Redis CPU µs / request", "redis_us_per_request", "{:.0f}"),
    ("Redis commands / request", "redis_cmds_per_request", "{:.1f}"),
    ("Redis socket reads / request", "redis_reads_per_request", "{:.1f}"),
    ("Redis idle CPU ms / s", "redis_idle_ms_per_s", "{:.2f}"),
    ("of the µs / request, idle time", "redis_idle_share_us", "{:.0f}"),
    ("scheduler CPU µs / request", "scheduler_us_per_request", "{:.0f}"),
    ("scheduler idle CPU ms / s", "scheduler_idle_ms_per_s", "{:.2f}"),
    ("of the µs / request, idle time", "scheduler_idle_share_us", "{:.0f}"),
    ("api CPU µs / request", "api_us_per_request", "{:.0f}"),
    ("load average (1 min)", "load_average", "{:.1f}"),
)


def table(runs: Sequence[ShardRun]) -> str:
    """The configurations side by side (Markdown): one column per number of shards."""
    summaries = [run.summary() for run in runs]
    lines = [
        "| | " + " | ".join(f"{run.shards} shard{'s' if run.shards > 1 else ''}" for run in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for title, key, shape in ROWS:
        lines.append(f"| {title} | " + " | ".join(shape.format(summary[key]) for summary in summaries) + " |")
    return "\n".join(lines)


def figures(runs: Sequence[ShardRun]) -> dict[str, float]:
    """The docs/benchmarks.json figures, each suffixed by its number of shards."""
    out: dict[str, float] = {}
    for one in runs:
        summary = one.summary()
        for key in (
            "redis_us_per_request",
            "redis_cmds_per_request",
            "scheduler_us_per_request",
            "redis_idle_ms_per_s",
            "scheduler_idle_ms_per_s",
        ):
            out[f"shard_{key}_{one.shards}"] = summary[key]
    return out


def docs_section(runs: Sequence[ShardRun], command: str) -> str:
    """The "Shards" section of docs/benchmarks.md: how it was run, the table, what it says."""
    requests = runs[0].redis.requests
    return "\n".join(
        [
            "## Shards: Redis and scheduler CPU per request with 1, 2 and 4 shards (SIMULATED GPU)",
            "",
            "```bash",
            command,
            "# writes shard_redis_us_per_request_<n>, shard_redis_cmds_per_request_<n>,",
            "# shard_scheduler_us_per_request_<n> and the idle rates into docs/benchmarks.json, this section",
            "```",
            "",
            "One fleet per column, side by side in one run on this machine: four models, one worker each (the",
            "SIMULATED GPU runner, 100 + 10 x B ms a forward, 20 steps each reported), one api, one scheduler process",
            "leading every shard, a private Valkey; the models in 1 shard, 2 of two, 4 of one (`model_shards`).",
            f"{requests} requests closed-loop over the four models in turn after a warm-up; the CPU of Valkey",
            "(`INFO cpu`), the scheduler and the api (`/proc/<pid>/stat`) over the window, per request; then the",
            "idle rates with the fleet up and no requests (each shard has its own lease, reaper and blocking reads).",
            "",
            table(runs),
            "",
            _comparison(runs),
            "What one shard allows, and the shards a fleet needs: [deploy.md](deploy.md#shards-how-many).",
            "",
        ]
    )


def _comparison(runs: Sequence[ShardRun]) -> str:
    """The most shards against the fewest, in words (the figures' ratios, nothing assumed)."""
    first, last = runs[0], runs[-1]
    if first is last:
        return ""
    ratio = last.redis.us_per_request / first.redis.us_per_request
    cmds = last.redis.cmds_per_request / first.redis.cmds_per_request
    sched = last.scheduler_us_per_request / first.scheduler_us_per_request
    reads = last.redis.reads_per_request / first.redis.reads_per_request
    net = (last.redis.us_per_request - last.redis.idle_share_us) / (
        first.redis.us_per_request - first.redis.idle_share_us
    )
    text = (
        f"From {first.shards} to {last.shards} shards a request costs Redis x{ratio:.2f} the CPU (x{net:.2f} less "
        f"the idle share), x{cmds:.2f} the commands and x{reads:.2f} "
        f"the socket reads, the scheduler x{sched:.2f} its CPU; the idle share rows are what the fleet's timers add "
        "over the window (each shard has its own lease, reaper and blocking reads)."
    )
    return textwrap.fill(text, width=116) + "\n"


def write_docs(runs: Sequence[ShardRun], docs_dir: Path, command: str) -> None:
    """Merge ``figures`` into docs/benchmarks.json and rewrite the section in docs/benchmarks.md."""
    merge_figures(docs_dir / "benchmarks.json", figures(runs))
    document = docs_dir / "benchmarks.md"
    text = document.read_text() if document.exists() else ""
    document.write_text(replace_section(text, docs_section(runs, command)))
