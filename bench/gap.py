"""The worker's own cost around each forward, at saturation, with a simulated GPU (``SimulatedGpuRunner``: each
forward sleeps ``a + b * B``, reporting every denoising step, CPU free as while a CUDA forward runs).

``python -m bench.gap [--requests 200] [--steps 20] [--seqs 4] [--lookahead-s S] [--compare] [--docs]``: one worker,
a backlog of ``requests``
compatible requests submitted at once (the worker never waits for work); the runner traces each forward's start and
end (``FUSEFLEET_SIM_TRACE``), and from those:

- **idle gap**: from the end of one forward to the start of the next on the same worker: whatever the worker does
  between forwards that the accelerator waits for (handing the batch to the finisher, freeing the slot, its Celery
  process acknowledging the task and fetching the next one, which the scheduler published while the forward ran,
  ``scheduler.capacity``'s prefetch; claiming it, reading its specs, journaling its keys), or, with the worker's
  lookahead (``worker_lookahead_s``, ``gpu_worker.lookahead``: the next batch taken and claimed while the forward
  runs), only ending one forward and starting the next in the same task;
- **in-forward overhead**: each forward's duration minus the simulated ``a + b * B`` (the step reports, sleeping
  granularity);
- **efficiency**: the simulated forward time over the wall time from the first forward's start to the last one's
  end (1.0 = the accelerator never waits).
Storing each batch's images and finishing its requests runs behind the next forward (``gpu_worker.finisher``), so
it shows in neither figure unless it takes longer than a forward. ``--lookahead-s`` sets the worker's lookahead (its
default when not given; 0: off); ``--compare`` measures without it and then with it, back to back, on the same
machine. ``--docs`` merges ``gap_ms_p50`` (with the lookahead at its default) into docs/benchmarks.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import bench_fleet
from bench.report import merge_figures

SIM_BASE_MS, SIM_PER_IMAGE_MS = 50.0, 10.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(requests: int, steps: int, seqs: int, log_dir: Path, lookahead_s: float | None = None) -> dict[str, Any]:
    """One saturated run (see the module's docstring); ``lookahead_s``: ``worker_lookahead_s``, None for its
    default."""
    trace = log_dir / "forwards.jsonl"
    env = {
        "FUSEFLEET_SIM_BASE_MS": str(SIM_BASE_MS),
        "FUSEFLEET_SIM_PER_IMAGE_MS": str(SIM_PER_IMAGE_MS),
        "FUSEFLEET_SIM_TRACE": str(trace),
    }
    if lookahead_s is not None:
        env["FUSEFLEET_WORKER_LOOKAHEAD_S"] = str(lookahead_s)
    with (
        bench_fleet(
            max_num_seqs=seqs, wait_ms=0, runner="bench.runners:SimulatedGpuRunner", log_dir=log_dir, extra_env=env
        ) as base,
        httpx.Client(base_url=base, timeout=60) as http,
    ):
        body = {"prompt": "gap", "width": 64, "height": 64, "num_inference_steps": steps}
        warm = http.post("/v1/requests/batch", json={"requests": [body] * seqs}).json()["ids"]
        for rid in warm:
            http.get(f"/v1/requests/{rid}", params={"wait_s": 60})
        warm_forwards = len(trace.read_text().splitlines())
        ids: list[str] = []
        for start in range(0, requests, 256):
            chunk = [body] * min(256, requests - start)
            ids += http.post("/v1/requests/batch", json={"requests": chunk}).json()["ids"]
        views = [http.get(f"/v1/requests/{rid}", params={"wait_s": 60}).json() for rid in ids]
    for view in views:
        assert view["status"] == "succeeded", view
    forwards = [json.loads(line) for line in trace.read_text().splitlines()[warm_forwards:]]
    forwards.sort(key=lambda forward: forward["start"])
    cost_s = [(SIM_BASE_MS + SIM_PER_IMAGE_MS * forward["images"]) / 1000 for forward in forwards]
    overheads = [(f["end"] - f["start"] - cost) * 1000 for f, cost in zip(forwards, cost_s, strict=True)]
    gaps = [(nxt["start"] - cur["end"]) * 1000 for cur, nxt in zip(forwards, forwards[1:], strict=False)]
    return {
        "worker_lookahead_s": "default" if lookahead_s is None else lookahead_s,
        "requests": requests,
        "steps": steps,
        "max_num_seqs": seqs,
        "batches": len(forwards),
        "mean_batch_size": statistics.mean(forward["images"] for forward in forwards),
        "forward_ms_simulated": f"{SIM_BASE_MS} + {SIM_PER_IMAGE_MS} x B",
        "overhead_ms_p50": statistics.median(overheads),
        "overhead_ms_p90": _percentile(overheads, 0.9),
        "gap_ms_p50": statistics.median(gaps),
        "gap_ms_p90": _percentile(gaps, 0.9),
        "efficiency": sum(cost_s) / (forwards[-1]["end"] - forwards[0]["start"]),
    }


def _seconds(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description="Per-forward overhead and idle gap of a saturated worker.")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seqs", type=int, default=4)
    parser.add_argument("--lookahead-s", type=float, default=None, help="worker_lookahead_s (0: off; default: its own)")
    parser.add_argument("--compare", action="store_true", help="without the lookahead, then with it, back to back")
    parser.add_argument("--docs", action="store_true", help="merge gap_ms_p50 into docs/benchmarks.json")
    parser.add_argument("--docs-dir", type=Path, default=Path("docs"), help="where benchmarks.json is")
    args = parser.parse_args()
    runs = [0.0, args.lookahead_s] if args.compare else [args.lookahead_s]
    for lookahead_s in runs:
        with tempfile.TemporaryDirectory(prefix="fusefleet-gap-") as logs:
            result = measure(args.requests, args.steps, args.seqs, Path(logs), lookahead_s)
        for name, value in result.items():
            print(f"{name}: {value:.2f}" if isinstance(value, float) else f"{name}: {value}")
        print()
    if args.docs and runs[-1] is None:
        merge_figures(args.docs_dir / "benchmarks.json", {"gap_ms_p50": result["gap_ms_p50"]})


if __name__ == "__main__":
    main()
