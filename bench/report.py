"""Summaries of load runs: throughput, latency percentiles, queue wait, batch sizes, failures; JSON and plots."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.targets import RequestRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(records: Sequence[RequestRecord], *, images_per_request: int = 1) -> dict[str, Any]:
    """Throughput over the whole run (first send to last answer) and per-request latency statistics."""
    done = [r for r in records if r.status == "succeeded"]
    span = (max(r.done_at for r in records) - min(r.sent_at for r in records)) if records else 0.0
    latencies = [r.latency_s for r in done]
    waits = [r.queue_wait_s for r in done if r.queue_wait_s is not None]
    batches = Counter(r.batch_size for r in done if r.batch_size is not None)
    failures = Counter(r.status for r in records if r.status != "succeeded")
    return {
        "requests": len(records),
        "succeeded": len(done),
        "failures": dict(failures),
        "first_errors": [r.error for r in records if r.error][:3],
        "duration_s": span,
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "images_per_s": len(done) * images_per_request / span if span > 0 else 0.0,
        "latency_s": {
            "mean": statistics.fmean(latencies) if latencies else None,
            "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "p99": percentile(latencies, 99),
        },
        "queue_wait_s": {"p50": percentile(waits, 50), "p95": percentile(waits, 95)},
        "batch_size_histogram": {str(size): count for size, count in sorted(batches.items())},
        "mean_batch_size": (sum(s * c for s, c in batches.items()) / sum(batches.values())) if batches else None,
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def merge_figures(path: Path, figures: dict[str, float]) -> dict[str, float]:
    """Write ``figures`` (rounded to 4 places) into the JSON object at ``path``, keeping every other key (each
    benchmark command owns its own figures); returns the merged object."""
    merged: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    merged.update({name: round(value, 4) for name, value in figures.items()})
    write_json(path, merged)
    return merged


def replace_section(document: str, section: str) -> str:
    """``document`` with the section headed by ``section``'s first line (from that heading to the next ``## ``
    heading) replaced by ``section``, or ``section`` appended when it has none: how a benchmark's ``--docs``
    rewrites its own section of docs/benchmarks.md."""
    heading = section.splitlines()[0]
    lines = document.splitlines()
    if heading not in lines:
        head = document.rstrip("\n")
        return (head + "\n\n" if head else "") + section.rstrip("\n") + "\n"
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = lines[end:]
    return "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), *([""] + tail if tail else [])]) + "\n"


def plot_runs(path: Path, title: str, runs: dict[str, list[tuple[float, dict[str, Any]]]]) -> None:
    """Two panels: p50/p99 latency vs offered load per system, and the batch-size histogram of each system's
    heaviest run. ``runs`` maps a system name to (offered load, summary) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency_ax, hist_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for index, (name, points) in enumerate(runs.items()):
        points = sorted(points, key=lambda p: p[0])
        loads = [load for load, _ in points]
        latency_ax.plot(loads, [s["latency_s"]["p50"] for _, s in points], marker="o", label=f"{name} p50")
        latency_ax.plot(loads, [s["latency_s"]["p99"] for _, s in points], marker="x", ls="--", label=f"{name} p99")
        hist = points[-1][1]["batch_size_histogram"] if points else {}
        if hist:  # systems side by side around each batch size
            sizes = [int(size) + 0.3 * index for size in hist]
            hist_ax.bar(sizes, list(hist.values()), width=0.3, label=name)
    latency_ax.set(xlabel="offered load (requests/s)", ylabel="latency (s)", title="latency vs offered load")
    latency_ax.legend(fontsize=7)
    hist_ax.set(xlabel="batch size", ylabel="requests", title="batch sizes (heaviest load)")
    if hist_ax.patches:
        hist_ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(path: Path, title: str, runs: dict[str, list[tuple[float, dict[str, Any]]]], capacity: float) -> None:
    """Two panels against offered load (a fraction of ``capacity``, images/s): each system's throughput next to
    the offered load and the capacity, and its p50/p99 latency (log scale). ``runs`` maps a system name to
    (load fraction, summary) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput_ax, latency_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loads = sorted({load for points in runs.values() for load, _ in points})
    tput_ax.plot([100 * load for load in loads], [load * capacity for load in loads], "k:", label="offered")
    tput_ax.axhline(capacity, color="grey", ls="--", lw=0.8, label="pipeline-alone capacity")
    for index, (name, points) in enumerate(runs.items()):
        points = sorted(points, key=lambda p: p[0])
        x, color = [100 * load for load, _ in points], f"C{index}"
        tput_ax.plot(x, [s["images_per_s"] for _, s in points], marker="o", color=color, label=name)
        latency_ax.plot(x, [s["latency_s"]["p50"] for _, s in points], marker="o", color=color, label=f"{name} p50")
        latency_ax.plot(
            x, [s["latency_s"]["p99"] for _, s in points], marker="x", ls="--", color=color, label=f"{name} p99"
        )
    tput_ax.set(xlabel="offered load (% of capacity)", ylabel="images/s", title="throughput")
    tput_ax.legend(fontsize=7)
    latency_ax.set(xlabel="offered load (% of capacity)", ylabel="latency (s)", yscale="log", title="latency")
    latency_ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
