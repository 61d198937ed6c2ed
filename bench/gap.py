"""The worker's own cost around each forward, at saturation, with a simulated GPU (``SimulatedGpuRunner``: each
forward sleeps ``a + b * B``, reporting every denoising step, CPU free as while a CUDA forward runs).

``python -m bench.gap [--requests 200] [--steps 20] [--seqs 4]``: one worker, a backlog of ``requests`` compatible
requests submitted at once (the worker never waits for work), then from every request's recorded times:

- **per-forward overhead**: the batch's claim-to-last-finish time minus the simulated forward ``a + b * B``
  (claiming, reading specs, journaling result keys, encoding and storing the images, finishing, step reports);
- **idle gap**: from a batch's last finish to the next batch's claim on the same worker (releasing the batch, the
  task's return to Celery, the scheduler publishing the next batch, Celery delivering it).
Both are worker-clock differences (claim and finish times are stamped by the worker).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import bench_fleet

SIM_BASE_MS, SIM_PER_IMAGE_MS = 50.0, 10.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(requests: int, steps: int, seqs: int, log_dir: Path) -> dict[str, Any]:
    env = {"FUSEFLEET_SIM_BASE_MS": str(SIM_BASE_MS), "FUSEFLEET_SIM_PER_IMAGE_MS": str(SIM_PER_IMAGE_MS)}
    with bench_fleet(
        max_num_seqs=seqs, wait_ms=0, runner="bench.runners:SimulatedGpuRunner", log_dir=log_dir, extra_env=env
    ) as base, httpx.Client(base_url=base, timeout=60) as http:
        body = {"prompt": "gap", "width": 64, "height": 64, "num_inference_steps": steps}
        warm = http.post("/v1/requests/batch", json={"requests": [body] * seqs}).json()["ids"]
        for rid in warm:
            http.get(f"/v1/requests/{rid}", params={"wait_s": 60})
        ids: list[str] = []
        for start in range(0, requests, 256):
            chunk = [body] * min(256, requests - start)
            ids += http.post("/v1/requests/batch", json={"requests": chunk}).json()["ids"]
        views = [http.get(f"/v1/requests/{rid}", params={"wait_s": 60}).json() for rid in ids]
    batches: dict[str, list[dict[str, Any]]] = {}
    for view in views:
        assert view["status"] == "succeeded", view
        batches.setdefault(view["batch_id"], []).append(view)
    spans = []
    for members in batches.values():
        started = min(_seconds(m["started_at"]) for m in members)
        finished = max(_seconds(m["finished_at"]) for m in members)
        spans.append((started, finished, len(members)))
    spans.sort()
    overheads = [(end - start) * 1000 - (SIM_BASE_MS + SIM_PER_IMAGE_MS * size) for start, end, size in spans]
    gaps = [(nxt[0] - cur[1]) * 1000 for cur, nxt in zip(spans, spans[1:], strict=False)]
    return {
        "requests": requests,
        "steps": steps,
        "max_num_seqs": seqs,
        "batches": len(spans),
        "mean_batch_size": statistics.mean(size for _, _, size in spans),
        "forward_ms_simulated": f"{SIM_BASE_MS} + {SIM_PER_IMAGE_MS} x B",
        "overhead_ms_p50": statistics.median(overheads),
        "overhead_ms_p90": _percentile(overheads, 0.9),
        "gap_ms_p50": statistics.median(gaps),
        "gap_ms_p90": _percentile(gaps, 0.9),
    }


def _seconds(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description="Per-forward overhead and idle gap of a saturated worker.")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seqs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusefleet-gap-") as logs:
        result = measure(args.requests, args.steps, args.seqs, Path(logs))
    for name, value in result.items():
        print(f"{name}: {value:.2f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
