"""Fleet metrics aggregated in Redis: what the Lua scripts and the workers count, and how it reads back.

Contract: every fleet-wide counter and histogram bucket is a field of one Redis hash, ``P:metrics``, incremented
atomically by whoever makes the transition it counts; this module names the fields' vocabulary (the buckets,
statuses, stages and outcomes below), builds a worker's increments (``forward_increments``, ``pow2_ms_bucket``,
the same rule as ``schedule.lua``) and reads the hash back (``parse_counters`` -> ``FleetCounters``) and the
``P:metrics:recent`` throughput ring (``recent_images``). The table of fields, who writes each and what it counts:
docs/operations.md#the-pmetrics-hash; the exported metrics: docs/operations.md#metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.contracts import TERMINAL_STATUSES, RequestStatus

TIME_BUCKETS_MS: tuple[int, ...] = tuple(2**k for k in range(21))
"""Upper bounds (ms) of the time histograms: 1 ms doubling to 2**20 ms (17.5 min); above the last: +Inf only."""
BATCH_SIZE_BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Upper bounds of the batch size histogram (``max_num_seqs`` is at most 256); Redis keeps exact sizes."""
FINISHED_STATUSES: tuple[str, ...] = tuple(sorted(status.value for status in TERMINAL_STATUSES))
ABORT_STAGES: tuple[str, ...] = tuple(
    status.value for status in (RequestStatus.QUEUED, RequestStatus.SCHEDULED, RequestStatus.RUNNING)
)
"""Where an abort can catch a request (``aborted:<stage>``)."""
WEBHOOK_OUTCOMES: tuple[str, ...] = ("delivered", "dropped", "retried", "superseded")
PROMPT_CACHE_OUTCOMES: tuple[str, ...] = ("hit", "miss")
"""What became of webhook delivery attempts (``webhooks:<outcome>``, ``webhook_outcome.lua``)."""
RECENT_SLOTS = 64
"""Seconds the throughput ring holds (more than ``RECENT_WINDOW_S``, so a slot is never reused inside the window)."""
RECENT_WINDOW_S = 60


def pow2_ms_bucket(ms: float) -> int:
    """The time histograms' bucket of a duration: the smallest power of two (ms, at least 1) not below it.
    ``schedule.lua`` computes the same for admission waits."""
    bucket = 1
    while bucket < ms:
        bucket *= 2
    return bucket


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: cumulative ``buckets`` as (upper bound, count), then +Inf = ``count``."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float


def histogram(counts: Mapping[float, int], bounds: Sequence[float], total: float) -> Histogram:
    """Cumulate exact or bucketed observation ``counts`` (value -> how many) over ``bounds``."""
    cumulative = tuple((bound, sum(n for value, n in counts.items() if value <= bound)) for bound in bounds)
    return Histogram(cumulative, sum(counts.values()), total)


@dataclass(frozen=True, slots=True)
class FleetCounters:
    """Everything ``P:metrics`` holds, parsed (``parse_counters``)."""

    accepted: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_STATUSES, 0))
    failures: dict[str, int] = field(default_factory=dict)  # error type -> failed requests
    aborts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ABORT_STAGES, 0))
    batch_sizes: dict[int, int] = field(default_factory=dict)  # requests in a batch -> batches formed
    admission_wait_ms: dict[int, int] = field(default_factory=dict)  # pow2 bucket (ms) -> requests
    admission_wait_s: float = 0.0
    forwards: dict[int, tuple[int, float]] = field(default_factory=dict)  # requests -> (forwards, seconds)
    step_ms: dict[int, int] = field(default_factory=dict)  # pow2 bucket (ms) -> forwards
    step_s: float = 0.0
    images: int = 0
    oom_splits: int = 0
    model_loads: dict[str, tuple[int, float]] = field(default_factory=dict)  # model -> (loads, seconds), by workers
    model_evictions: dict[str, int] = field(default_factory=dict)  # model -> evictions by workers (LRU)
    webhooks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WEBHOOK_OUTCOMES, 0))  # outcome -> count
    prompt_cache: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_CACHE_OUTCOMES, 0))  # by workers

    @property
    def batch_size(self) -> Histogram:
        total = sum(size * n for size, n in self.batch_sizes.items())
        return histogram({float(size): n for size, n in self.batch_sizes.items()}, BATCH_SIZE_BUCKETS, total)

    @property
    def admission_wait(self) -> Histogram:
        return _time_histogram(self.admission_wait_ms, self.admission_wait_s)

    @property
    def step(self) -> Histogram:
        return _time_histogram(self.step_ms, self.step_s)


def _time_histogram(counts: Mapping[int, int], total_s: float) -> Histogram:
    """Bounds in seconds; the pow2 ms buckets are the bounds themselves (anything past the last is only in +Inf)."""
    in_seconds = {bucket / 1000: n for bucket, n in counts.items()}
    return histogram(in_seconds, [bound / 1000 for bound in TIME_BUCKETS_MS], total_s)


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def parse_counters(raw: Mapping[str, str]) -> FleetCounters:
    """``P:metrics`` as HGETALL returns it; fields it does not know are ignored (another version's)."""
    scalars: dict[str, float] = {}
    finished = dict.fromkeys(FINISHED_STATUSES, 0)
    aborts = dict.fromkeys(ABORT_STAGES, 0)
    webhooks = dict.fromkeys(WEBHOOK_OUTCOMES, 0)
    prompt_cache = dict.fromkeys(PROMPT_CACHE_OUTCOMES, 0)
    failures: dict[str, int] = {}
    by_number: dict[str, dict[int, int]] = {"batch_size": {}, "admission_wait_ms": {}, "step_ms": {}}
    forward_counts: dict[int, int] = {}
    forward_sums: dict[int, float] = {}
    load_counts: dict[str, int] = {}
    load_sums: dict[str, float] = {}
    evictions: dict[str, int] = {}
    for name, text in raw.items():
        value = _number(text)
        kind, _, rest = name.partition(":")
        if name in ("accepted", "images", "oom_splits", "admission_wait:sum", "step:sum"):
            scalars[name] = value
        elif kind == "finished" and rest:
            finished[rest] = int(value)
        elif kind == "failed":
            failures[rest or "unknown"] = int(value)
        elif kind == "aborted" and rest:
            aborts[rest] = int(value)
        elif kind == "webhooks" and rest:
            webhooks[rest] = int(value)
        elif kind in by_number and rest.isdigit():
            by_number[kind][int(rest)] = int(value)
        elif kind == "model_load" and rest:
            model, _, part = rest.rpartition(":")
            if part == "count":
                load_counts[model] = int(value)
            elif part == "sum":
                load_sums[model] = value
        elif kind == "prompt_cache" and rest in prompt_cache:
            prompt_cache[rest] = int(value)
        elif kind == "model_evicted" and rest:
            evictions[rest] = int(value)
        elif kind == "forward":
            size, _, part = rest.partition(":")
            if size.isdigit() and part == "count":
                forward_counts[int(size)] = int(value)
            elif size.isdigit() and part == "sum":
                forward_sums[int(size)] = value
    return FleetCounters(
        accepted=int(scalars.get("accepted", 0)),
        finished=finished,
        failures=failures,
        aborts=aborts,
        batch_sizes=by_number["batch_size"],
        admission_wait_ms=by_number["admission_wait_ms"],
        admission_wait_s=scalars.get("admission_wait:sum", 0.0),
        forwards={size: (n, forward_sums.get(size, 0.0)) for size, n in forward_counts.items()},
        step_ms=by_number["step_ms"],
        step_s=scalars.get("step:sum", 0.0),
        images=int(scalars.get("images", 0)),
        oom_splits=int(scalars.get("oom_splits", 0)),
        model_loads={model: (n, load_sums.get(model, 0.0)) for model, n in load_counts.items()},
        model_evictions=evictions,
        webhooks=webhooks,
        prompt_cache=prompt_cache,
    )


def forward_increments(batch_size: int, images: int, steps: int, seconds: float) -> dict[str, float]:
    """The ``P:metrics`` increments of one forward of ``batch_size`` requests that produced ``images`` outputs in
    ``steps`` denoising steps and ``seconds``."""
    seconds = max(0.0, seconds)
    increments: dict[str, float] = {
        f"forward:{batch_size}:count": 1,
        f"forward:{batch_size}:sum": seconds,
        "images": images,
    }
    if steps > 0:
        step_s = seconds / steps
        increments[f"step_ms:{pow2_ms_bucket(step_s * 1000)}"] = 1
        increments["step:sum"] = step_s
    return increments


OOM_SPLIT_INCREMENTS: dict[str, float] = {"oom_splits": 1}


def model_load_increments(model: str, seconds: float) -> dict[str, float]:
    """The ``P:metrics`` increments of one load of ``model`` by a worker that took ``seconds``."""
    return {f"model_load:{model}:count": 1, f"model_load:{model}:sum": max(0.0, seconds)}


def model_eviction_increments(model: str) -> dict[str, float]:
    """The ``P:metrics`` increments of one eviction of ``model`` by a worker (``gpu_worker.residency``)."""
    return {f"model_evicted:{model}": 1}


def prompt_cache_increments(hits: int, misses: int) -> dict[str, float]:
    """The ``P:metrics`` increments of prompt-cache lookups: rows found encoded, rows encoded
    (``gpu_worker.prompt_cache``)."""
    return {name: count for name, count in (("prompt_cache:hit", hits), ("prompt_cache:miss", misses)) if count}


def recent_images(ring: Mapping[str, str], now_s: int, window_s: int = RECENT_WINDOW_S) -> int:
    """Images produced in the ``window_s`` seconds up to ``now_s`` (Redis time), from the ``P:metrics:recent``
    ring; slots older than the window (a slot is reused every ``RECENT_SLOTS`` s) are ignored."""
    total = 0
    for value in ring.values():
        second, _, images = value.partition(" ")
        if second.isdigit() and now_s - window_s < int(second) <= now_s:
            total += int(_number(images))
    return total
