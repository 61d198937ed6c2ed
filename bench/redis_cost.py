"""What one request costs Redis: commands and Redis CPU per request, by command (``python -m bench redis``).

One fleet per runner on a private Valkey (``fusefleet.valkey.EmbeddedValkey``, passed to ``bench.fleet`` as
``FUSEFLEET_REDIS_URL``): the SIMULATED GPU runner (``SimulatedGpuRunner``, 100 + 10 x B ms a forward, reporting
every one of the 20 steps) and, unless ``--no-null``, the null runner (no steps, no progress). Each run warms up,
sends ``CONFIG RESETSTAT``, runs ``requests`` requests closed-loop (``concurrency`` clients, each submitting and
long-polling as a client does), then reads ``INFO commandstats`` and ``INFO cpu``. Everything Redis did in that
window is charged to the requests, the fleet's timers (heartbeats, lease renewals, the reaper) included.

The figures (the pure part: ``command_costs``, ``RedisCost``):
- **commands per request**: every command's ``calls`` summed, the commands a Lua script calls included (Redis counts
  them in their own rows as well as the script's ``EVALSHA``);
- **Redis CPU per request**: the server process's CPU time (``used_cpu_user + used_cpu_sys``) over the window, per
  request: what bounds one Redis core's requests/s. The by-command table gives each command's ``usec`` (a
  script's includes the commands it calls, so the rows overlap and their sum, also printed, exceeds the CPU time).
- **socket reads per request**: ``INFO stats`` ``total_reads_processed`` over the window (the server's reads of
  its clients' sockets: about one per round trip, a pipeline's commands or a script's in one), what the
  server spends on the network beside the commands (tens of µs a read on a small VM, more than most commands);
- **the fleet's idle rate**: after the window the fleet runs on without requests for ``idle_s``; the server's CPU
  per second then (heartbeats, leases, the scheduler's and workers' blocking reads timing out, the server's own
  cron) times the window's length is the part of the CPU per request that is time, not requests (``idle_share``).
- **by script** (``--by-script``, a run of its own: the log costs CPU too): ``SLOWLOG`` with a threshold of 0 logs
  every top-level command with its execution time (not the network's part); ``EVALSHA`` entries are named by
  their SHA1 (``shared.keys``' scripts) and summed per script (``ScriptCost``).
``--docs`` writes ``redis_cmds_per_request`` and ``redis_us_per_request`` (simulated runner) and their ``_null``
twins into docs/benchmarks.json (``bench.report.merge_figures``).
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.fleet import bench_fleet
from bench.loadgen import LoadSpec, run_load
from bench.targets import FusefleetTarget
from fusefleet.valkey import EmbeddedValkey

RUNNERS = {"simulated": "bench.runners:SimulatedGpuRunner", "null": "bench.runners:NullRunner"}
SIM_ENV = {"FUSEFLEET_SIM_BASE_MS": "100", "FUSEFLEET_SIM_PER_IMAGE_MS": "10"}
OWN_COMMANDS = frozenset({"config|resetstat", "info"})  # the benchmark's own: not charged to the requests
WARM_UP = 16  # requests before the window


@dataclass(frozen=True)
class CommandCost:
    """One row of ``INFO commandstats``: a command's calls and the microseconds they took."""

    name: str
    calls: int
    usec: int


def command_costs(commandstats: Mapping[str, Mapping[str, Any]]) -> list[CommandCost]:
    """The rows of ``INFO commandstats`` as redis-py parses it (``{"cmdstat_hget": {"calls": 3, "usec": 9, ...}}``),
    names lower-cased without the ``cmdstat_`` prefix (subcommands keep theirs: ``config|resetstat``), the
    benchmark's own commands (``OWN_COMMANDS``) left out."""
    rows = []
    for key, stat in commandstats.items():
        name = key.removeprefix("cmdstat_").lower()
        if key.startswith("cmdstat_") and name not in OWN_COMMANDS:
            rows.append(CommandCost(name, int(stat["calls"]), int(stat["usec"])))
    return rows


@dataclass(frozen=True)
class RedisCost:
    """What ``requests`` requests cost Redis: the commands of the window and the server's CPU seconds in it."""

    requests: int
    commands: tuple[CommandCost, ...]
    cpu_s: float
    window_s: float = 0.0  # the window's wall time
    idle_cpu_rate: float = 0.0  # the server's CPU seconds per second with the fleet up and no requests
    scripts: tuple[ScriptCost, ...] = ()  # by script (``--by-script`` runs only)
    reads: int = 0  # the server's socket reads over the window (``total_reads_processed``)

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")

    @property
    def cmds_per_request(self) -> float:
        """Every command's calls over the requests (script-called commands included)."""
        return sum(row.calls for row in self.commands) / self.requests

    @property
    def reads_per_request(self) -> float:
        """The server's socket reads over the requests: about its round trips per request."""
        return self.reads / self.requests

    @property
    def us_per_request(self) -> float:
        """The server's CPU microseconds over the requests."""
        return self.cpu_s * 1e6 / self.requests

    @property
    def command_us_per_request(self) -> float:
        """commandstats ``usec`` summed over the requests (scripts and the commands they call both counted)."""
        return sum(row.usec for row in self.commands) / self.requests

    @property
    def idle_share_us(self) -> float:
        """The part of ``us_per_request`` the fleet would have spent idle over the window (time, not requests)."""
        return self.idle_cpu_rate * self.window_s * 1e6 / self.requests

    def by_cost(self) -> list[CommandCost]:
        """The commands, most costly (``usec``) first; ties by calls, then name."""
        return sorted(self.commands, key=lambda row: (-row.usec, -row.calls, row.name))

    def table(self, top: int | None = None) -> str:
        """A Markdown table: per request, each command's calls and µs, and its µs per call, most costly first."""
        lines = ["| command | calls / request | µs / request | µs / call |", "|---|---|---|---|"]
        for row in self.by_cost()[:top]:
            per_call = row.usec / row.calls if row.calls else 0.0
            lines.append(
                f"| {row.name.upper()} | {row.calls / self.requests:.2f} | {row.usec / self.requests:.1f} "
                f"| {per_call:.1f} |"
            )
        return "\n".join(lines)

    def summary(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "cmds_per_request": self.cmds_per_request,
            "us_per_request": self.us_per_request,
            "reads_per_request": self.reads_per_request,
            "command_us_per_request": self.command_us_per_request,
            "window_s": self.window_s,
            "idle_share_us": self.idle_share_us,
        }

    def script_table(self) -> str:
        """A Markdown table of the scripts (``--by-script``): per request, calls, µs and µs per call (median too)."""
        lines = [
            "| script | calls / request | µs / request | µs / call (mean) | µs / call (median) |",
            "|---|---|---|---|---|",
        ]
        for row in sorted(self.scripts, key=lambda row: (-row.usec, row.name)):
            lines.append(
                f"| {row.name} | {row.calls / self.requests:.2f} | {row.usec / self.requests:.1f} "
                f"| {row.usec / row.calls:.1f} | {row.median_us:.1f} |"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class ScriptCost:
    """One script's (or one plain command's) top-level calls in the window and their execution microseconds."""

    name: str
    calls: int
    usec: int
    median_us: float


def script_names() -> dict[str, str]:
    """The SHA1 of each of ``shared.keys``' scripts (as ``EVALSHA`` names it) -> the script's name (``FINISH``)."""
    from shared import keys

    return {
        hashlib.sha1(value.encode()).hexdigest(): name
        for name, value in vars(keys).items()
        if name.isupper() and isinstance(value, str) and "redis.call" in value
    }


def script_costs(entries: Sequence[Mapping[str, Any]], names: Mapping[str, str]) -> list[ScriptCost]:
    """``SLOWLOG GET`` entries (redis-py's: ``command`` the space-joined arguments, ``duration`` µs) summed by
    script: an ``EVALSHA`` by the name of its SHA1 (``names``; unknown ones as ``evalsha:<sha>``), any other
    command by its name in lower case."""
    durations: dict[str, list[int]] = {}
    for entry in entries:
        command = entry["command"]
        words = (command.decode(errors="replace") if isinstance(command, bytes) else str(command)).split()
        if not words:
            continue
        head = words[0].lower()
        if head == "evalsha" and len(words) > 1:
            name = names.get(words[1].lower(), f"evalsha:{words[1][:8]}")
        else:
            name = head
        if head in ("slowlog", "info", "config"):  # the benchmark's own
            continue
        durations.setdefault(name, []).append(int(entry["duration"]))
    return [
        ScriptCost(name, len(values), sum(values), float(statistics.median(values)))
        for name, values in durations.items()
    ]


def server_reads(client: redis.Redis) -> int:
    """The server's socket reads so far (``INFO stats`` ``total_reads_processed``: about one per round trip)."""
    return int(client.info("stats")["total_reads_processed"])


def server_cpu_s(client: redis.Redis) -> float:
    """The server process's CPU seconds so far (user + system)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(
    runner: str,
    *,
    requests: int,
    concurrency: int,
    steps: int,
    seqs: int,
    log_dir: Path,
    idle_s: float = 0.0,
    by_script: bool = False,
    code_dir: Path | None = None,
    server_binary: str | None = None,
    broker_apart: bool = False,
) -> RedisCost:
    """One fleet of ``runner`` (a key of ``RUNNERS``) on a private Valkey: warm up, reset the stats, run the
    requests closed-loop, read the stats; then, for ``idle_s`` > 0, the idle rate (see the module docstring).
    ``by_script``: log every command's execution time (SLOWLOG) over the window and sum it by script.
    ``code_dir``: the fleet runs from that source tree (``side_by_side``'s baseline), the client from this one.
    ``server_binary``: the Redis-compatible server to run (None: the embedded Valkey's, ``fusefleet.valkey``).
    ``broker_apart``: the Celery broker on a second private server (``FUSEFLEET_BROKER_URL``: the production layout
    of docs/deploy.md), so the figures are the fleet's state Redis alone; else the broker shares it (the default)."""
    with tempfile.TemporaryDirectory(prefix="fusefleet-redis-cost-") as folder:
        server = EmbeddedValkey(Path(folder), binary=server_binary).start()
        broker = EmbeddedValkey(Path(folder) / "broker", binary=server_binary).start() if broker_apart else None
        try:
            env = {"FUSEFLEET_REDIS_URL": server.url, **SIM_ENV}
            if broker is not None:
                env["FUSEFLEET_BROKER_URL"] = broker.url
            with (
                redis.Redis.from_url(server.url) as client,
                bench_fleet(
                    max_num_seqs=seqs,
                    wait_ms=20,
                    runner=RUNNERS[runner],
                    log_dir=log_dir / runner,
                    extra_env=env,
                    code_dir=code_dir,
                ) as base,
            ):
                target = FusefleetTarget(base, wait_s=60)
                load = LoadSpec(pattern="closed", count=WARM_UP, concurrency=concurrency, steps=steps)
                run_to_success(target, load)
                if by_script:
                    client.config_set("slowlog-max-len", 1_000_000)
                    client.config_set("slowlog-log-slower-than", 0)
                    client.slowlog_reset()
                client.config_resetstat()
                reads_before, before, started = server_reads(client), server_cpu_s(client), time.monotonic()
                run_to_success(target, LoadSpec(pattern="closed", count=requests, concurrency=concurrency, steps=steps))
                cpu_s, window_s = server_cpu_s(client) - before, time.monotonic() - started
                reads = server_reads(client) - reads_before - 3  # less ours: two INFO cpu, this INFO stats
                commands = tuple(command_costs(client.info("commandstats")))
                scripts: tuple[ScriptCost, ...] = ()
                if by_script:
                    client.config_set("slowlog-log-slower-than", -1)
                    scripts = tuple(script_costs(client.slowlog_get(-1), script_names()))
                idle_rate = 0.0
                if idle_s > 0:
                    idle_before = server_cpu_s(client)
                    time.sleep(idle_s)
                    idle_rate = (server_cpu_s(client) - idle_before) / idle_s
                cost = RedisCost(requests, commands, cpu_s, window_s, idle_rate, scripts, reads)
        finally:
            server.stop()
            if broker is not None:
                broker.stop()
    return cost


def run_to_success(target: FusefleetTarget, load: LoadSpec) -> None:
    """Run ``load`` against ``target``; RuntimeError when any request did not succeed."""
    records = asyncio.run(run_load(target, load, timeout_s=300))
    failed = [record for record in records if record.status != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests did not succeed: {failed[0].error}")


def figures(results: Mapping[str, RedisCost]) -> dict[str, float]:
    """The docs/benchmarks.json figures: the simulated runner's plain, the null runner's with ``_null``."""
    out: dict[str, float] = {}
    for runner, cost in results.items():
        suffix = "" if runner == "simulated" else f"_{runner}"
        out[f"redis_cmds_per_request{suffix}"] = cost.cmds_per_request
        out[f"redis_us_per_request{suffix}"] = cost.us_per_request
    return out


def report(results: Mapping[str, RedisCost], top: int | None = 15) -> str:
    """Each runner's totals and its by-command table (Markdown)."""
    parts: list[str] = []
    for runner, cost in results.items():
        parts += [
            f"### {runner} runner: {cost.requests} requests",
            "",
            f"{cost.cmds_per_request:.1f} commands and {cost.us_per_request:.0f} µs of Redis CPU per request "
            f"(commandstats usec summed: {cost.command_us_per_request:.0f} µs, scripts counted with what they call), "
            f"{cost.reads_per_request:.2f} socket reads (round trips); "
            f"window {cost.window_s:.1f} s, of which the fleet's idle rate ({cost.idle_cpu_rate * 1e3:.2f} ms/s) "
            f"makes {cost.idle_share_us:.0f} µs a request",
            "",
            cost.table(top),
            "",
        ]
        if cost.scripts:
            title = "By script (SLOWLOG: execution only, the network's part not counted):"
            parts += [title, "", cost.script_table(), ""]
    return "\n".join(parts)


def run(runners: Sequence[str], **kwargs: Any) -> dict[str, RedisCost]:
    """``measure`` each runner in turn."""
    return {runner: measure(runner, **kwargs) for runner in runners}


@dataclass(frozen=True)
class SideBySide:
    """The simulated runner's cost on an earlier revision (``baseline``, its fleet run from a worktree of it) and on
    this tree, measured in turns in one run (baseline first in each round) with the same client and load."""

    baseline: str
    before: tuple[RedisCost, ...]
    after: tuple[RedisCost, ...]

    @staticmethod
    def _median(costs: Sequence[RedisCost], figure: str) -> float:
        return float(statistics.median(getattr(cost, figure) for cost in costs))

    def ratio(self, figure: str) -> float:
        """This tree's median of ``figure`` (a ``RedisCost`` property) over the baseline's."""
        return self._median(self.after, figure) / self._median(self.before, figure)

    def table(self) -> str:
        """Markdown: each figure's rounds and medians, before and after, and their ratio."""
        rows = [
            ("commands / request", "cmds_per_request", "{:.1f}"),
            ("Redis CPU µs / request", "us_per_request", "{:.0f}"),
            ("socket reads / request", "reads_per_request", "{:.2f}"),
        ]
        lines = [
            f"| per request | {self.baseline} (rounds) | median | this tree (rounds) | median | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for label, figure, form in rows:
            before = ", ".join(form.format(getattr(cost, figure)) for cost in self.before)
            after = ", ".join(form.format(getattr(cost, figure)) for cost in self.after)
            lines.append(
                f"| {label} | {before} | {form.format(self._median(self.before, figure))} | {after} "
                f"| {form.format(self._median(self.after, figure))} | {self.ratio(figure):.3f} |"
            )
        return "\n".join(lines)


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of ``revision`` of this repository, removed afterwards."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="fusefleet-baseline-") as parent:
        path = Path(parent) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(path), revision], check=True,
                       capture_output=True)  # fmt: skip
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False,
                           capture_output=True)  # fmt: skip


def side_by_side(baseline: str, rounds: int, **kwargs: Any) -> SideBySide:
    """``measure`` the simulated runner ``rounds`` times on ``baseline`` (a git revision) and on this tree, in
    turns (ABAB...), each on a fresh fleet and Valkey."""
    before: list[RedisCost] = []
    after: list[RedisCost] = []
    with worktree(baseline) as tree:
        for _ in range(rounds):
            before.append(measure("simulated", code_dir=tree, **kwargs))
            after.append(measure("simulated", **kwargs))
    return SideBySide(baseline, tuple(before), tuple(after))
