"""A high-priority request's latency on a fleet saturated by low-priority work, against an idle fleet (SIMULATED GPU
runner: ``SimulatedGpuRunner``, each forward sleeps ``a + b * B``, reporting every step, CPU free as while a CUDA
forward runs). Every figure it gives is *simulated*.

The default cost model is ``bench.peers.simulated_gpu.GPU_SHAPED`` (Stable Diffusion 1.5, 512 px, 20 steps on an
H200: a = 531 ms, b = 103.5 ms per image).

``python -m bench priority [--workers 2] [--seqs 4] [--probes 20]``: one fleet; first ``probes`` requests at
priority 2 one after the other on the idle fleet, then a backlog of compatible priority -2 requests large enough to
keep every worker busy for the whole phase, and the same probes again, each after a random pause (so probes land
anywhere in the batches running). A probe's latency is its server-side ``finished_at - created_at``;
``prio_latency_ratio`` is the median saturated latency over the median idle one. The run checks that the backlog
was still waiting when the last probe finished (the fleet was saturated throughout).

Without priorities a probe would wait behind the whole backlog; with them it waits only for a worker slot to free
(at most the rest of the forwards in flight, which no request-level scheduler can shorten) and then runs alone:
levels never share a batch (``scheduler.policy``).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import bench_fleet
from bench.peers.simulated_gpu import GPU_SHAPED
from bench.report import percentile

HIGH, LOW = 2, -2  # the probes' and the backlog's priority levels
CHUNK = 256  # requests per POST /v1/requests/batch


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


def _summary(latencies_s: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in latencies_s]
    return {
        "p50": statistics.median(ms),
        "p90": percentile(ms, 90) or 0.0,
        "max": max(ms),
    }


class _Probe:
    def __init__(self, http: httpx.Client, body: dict[str, Any]) -> None:
        self._http = http
        self._body = body

    def run(self) -> dict[str, Any]:
        """Submit one high-priority request, wait for its end; its view."""
        response = self._http.post("/v1/requests", json={**self._body, "prompt": "probe", "priority": HIGH})
        response.raise_for_status()
        request_id = response.json()["id"]
        view: dict[str, Any] = self._http.get(f"/v1/requests/{request_id}", params={"wait_s": 60}).json()
        if view["status"] != "succeeded":
            raise RuntimeError(f"probe {request_id} ended {view['status']}: {view.get('error')}")
        return view


def measure(
    *,
    workers: int,
    seqs: int,
    probes: int,
    log_dir: Path,
    steps: int = 20,
    base_ms: float = GPU_SHAPED.base_ms,
    per_image_ms: float = GPU_SHAPED.per_image_ms,
    wait_ms: float = 20.0,
    seed: int = 0,
) -> dict[str, Any]:
    """The idle and saturated probe latencies and their ratio (see the module docstring)."""
    forward_s = (base_ms + per_image_ms * seqs) / 1000  # a full batch of the backlog
    env = {"FUSEFLEET_SIM_BASE_MS": str(base_ms), "FUSEFLEET_SIM_PER_IMAGE_MS": str(per_image_ms)}
    body: dict[str, Any] = {"width": 64, "height": 64, "num_inference_steps": steps}
    pause = random.Random(seed)
    with bench_fleet(
        max_num_seqs=seqs,
        wait_ms=wait_ms,
        workers=workers,
        runner="bench.runners:SimulatedGpuRunner",
        log_dir=log_dir,
        extra_env=env,
    ) as base, httpx.Client(base_url=base, timeout=120) as http:
        probe = _Probe(http, body)
        for _ in range(3):  # warm-up: first connections, first batches
            probe.run()
        idle = []
        for _ in range(probes):
            time.sleep(pause.uniform(0, forward_s))
            idle.append(probe.run())

        throughput = workers * seqs / forward_s  # backlog requests/s at saturation
        phase_s = probes * (forward_s + 3 * _seconds_of(idle))
        backlog_size = int(2 * throughput * phase_s) + 2 * workers * seqs
        backlog: list[str] = []
        for start in range(0, backlog_size, CHUNK):
            chunk = [{**body, "prompt": f"backlog {start + i}", "priority": LOW} for i in range(CHUNK)]
            response = http.post("/v1/requests/batch", json={"requests": chunk[: backlog_size - start]})
            response.raise_for_status()
            backlog += response.json()["ids"]
        time.sleep(2 * forward_s)  # every worker busy with backlog batches
        saturated = []
        for _ in range(probes):
            time.sleep(pause.uniform(0, forward_s))
            saturated.append(probe.run())
        last = http.get(f"/v1/requests/{backlog[-1]}").json()["status"]

    idle_s = [_latency(view) for view in idle]
    saturated_s = [_latency(view) for view in saturated]
    return {
        "simulated": True,
        "forward_ms": f"{base_ms} + {per_image_ms} x B",
        "workers": workers,
        "max_num_seqs": seqs,
        "steps": steps,
        "request_batch_max_wait_ms": wait_ms,
        "probes": probes,
        "backlog": backlog_size,
        "saturated_throughout": last == "queued",
        "probe_batch_sizes": sorted({view["batch_size"] for view in idle + saturated}),
        "idle_ms": _summary(idle_s),
        "saturated_ms": _summary(saturated_s),
        "prio_latency_ratio": statistics.median(saturated_s) / statistics.median(idle_s),
        "p90_ratio": (percentile(saturated_s, 90) or 0.0) / (percentile(idle_s, 90) or 1.0),
    }


def _latency(view: dict[str, Any]) -> float:
    return _seconds(view["finished_at"]) - _seconds(view["created_at"])


def _seconds_of(views: Sequence[dict[str, Any]]) -> float:
    """The median latency of ``views``."""
    return statistics.median(_latency(view) for view in views)
